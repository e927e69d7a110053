"""Fixtures of the learner tests."""
import pytest
import torch

from agentq.agent.trajectory import Trajectory
from agentq.learner.batch import collate


@pytest.fixture
def two_episode_batch():
    """Two one-turn episodes of one GRPO group (4 prompt tokens, 3 sampled), advantages +1 / -1."""
    trajs = []
    for i in range(2):
        t = Trajectory(episode_id=i, task_id="t", split="train", group_id=0)
        t.append([5, 6, 7, 8], sampled=False)
        t.append([9, 10, 11], sampled=True, seg=1, logps=[-1.0, -1.2, -0.9])
        trajs.append(t)
    return collate(trajs, torch.tensor([1.0, -1.0]))
