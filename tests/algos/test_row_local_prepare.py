"""`Objective.row_local_prepare`, the flag `trainer.old_logp=bypass` trusts: where it is True,
`prepare` on any subset of rows gives those rows what it gives them on the whole batch (weights and
per-row extras, to the bit), so the learner may run it per micro-batch; where it is False the
subset's weights differ. Every registered objective is listed here, so a new one must say."""
import pytest
import torch

from agentq.algos import GRPO, make_objective, objective_names
from agentq.algos.objective import Prepared

from algo_batches import make_batch

ROW_LOCAL = {"grpo": True, "tis": True, "qurl": True, "tbpo": True, "interq": True, "ais": False}
SUBSET = torch.tensor([3, 0, 5])


def random_batch(B: int = 6, L: int = 12):
    """Rows of mixed action runs and turns, δ large enough to reach TIS's cap and AIS's gate."""
    g = torch.Generator().manual_seed(7)
    pos = torch.arange(L).expand(B, L)
    mask = ((pos % 4) >= 1).float() * (pos >= 1) * (pos < torch.tensor([12, 9, 11, 6, 12, 8])[:, None])
    seg = (pos // 4 + 1) * mask.long()
    delta = 0.8 * torch.randn(B, L, generator=g, dtype=torch.float64) * mask
    return make_batch(mask, seg, delta, adv=torch.randn(B, generator=g))


def rows_of(prep: Prepared, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"token_weight": prep.token_weight[idx], **{k: v[idx] for k, v in prep.extra.items()}}


def test_every_registered_objective_declares_its_flag():
    assert sorted(ROW_LOCAL) == objective_names()
    for name, want in ROW_LOCAL.items():
        assert make_objective(name).row_local_prepare is want, name


@pytest.mark.parametrize("name", sorted(ROW_LOCAL))
def test_row_local_prepare_gives_a_subset_its_whole_batch_weights(name):
    batch = random_batch()
    obj = make_objective(name, **({"token_tis_cap": 2.0} if name == "interq" else {}))
    whole = rows_of(obj.prepare(batch), SUBSET)
    part = rows_of(obj.prepare(batch.index(SUBSET)), torch.arange(len(SUBSET)))
    assert whole.keys() == part.keys()
    same = all(torch.equal(whole[k], part[k]) for k in whole)
    assert same is ROW_LOCAL[name], name
    assert whole["token_weight"].abs().sum() > 0


def test_interq_with_renorm_is_not_row_local():
    """renorm_retention divides every row's α by the minibatch's token-mean of α (`minibatch_extra`),
    which bypass, computing α per micro-batch after its forward, cannot know before the first loss."""
    assert make_objective("interq", renorm_retention=True).row_local_prepare is False
    assert make_objective("interq", renorm_retention=False).row_local_prepare is True
    from agentq.algos.interq import InterQ
    assert InterQ.row_local_prepare is True                    # the instance flag does not leak to the class


def test_a_new_prepare_is_not_row_local_until_declared():
    class BatchMean(GRPO):
        def prepare(self, batch):
            return Prepared(batch.action_mask.float() / batch.action_mask.mean())

    class Declared(GRPO):
        row_local_prepare = True

        def prepare(self, batch):
            return Prepared(2 * batch.action_mask.float())

    class SameWeights(GRPO):                     # GRPO's own prepare: inherits its flag
        pass

    assert BatchMean.row_local_prepare is False and Declared.row_local_prepare is True
    assert SameWeights.row_local_prepare is True and GRPO.row_local_prepare is True
