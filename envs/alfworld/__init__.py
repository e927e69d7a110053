"""ALFWorld for agentq: real games for evaluation, generated games for training.

    import gymnasium as gym, agentq.envs
    env = gym.make("agentq/ALFWorld-v0", split="valid_unseen", expert=True)

Modules: `env` (the `ALFWorldEnv` Gymnasium environment), `generator` (ALFWorld-style games from
the alfworld wheel's data), `data` (real games under $ALFWORLD_DATA), `experts` (handcoded expert,
planner walkthroughs), `parse_cache` (the step-time patch). Importing this package is cheap; the
engine (textworld, Fast Downward) loads with `env`. See docs/envs/alfworld.md.
"""
from .data import forget_empty_data_var
from .generator import GEN_SPLITS, TASK_TYPES, UNSEEN_FLOOR_PLANS

# before any module here imports alfworld, whose import fails on ALFWORLD_DATA= (set but empty)
forget_empty_data_var()

__all__ = ["GEN_SPLITS", "TASK_TYPES", "UNSEEN_FLOOR_PLANS", "ALFWorldEnv"]


def __getattr__(name):
    if name == "ALFWorldEnv":
        from .env import ALFWorldEnv
        return ALFWorldEnv
    raise AttributeError(name)
