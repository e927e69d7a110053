import math
"""The update's statistics: summed on the device per micro-batch, read back once per minibatch,
and equal to what reading each micro-batch's numbers back as Python floats gave."""
import torch

from agentq.learner.learner import add_weighted, read_back, update_summary


def test_weighted_sums_match_python_float_sums_and_keep_plain_floats():
    micro = [({"pg_loss": torch.tensor(0.25), "kl": torch.tensor(1e-3), "is_weight_mean": 0.5}, 0.375),
             ({"pg_loss": torch.tensor(-0.125), "kl": torch.tensor(3e-3), "is_weight_mean": 1.5}, 0.625)]
    acc: dict = {}
    for stats, share in micro:
        add_weighted(acc, stats, share)
    assert torch.is_tensor(acc["pg_loss"]) and acc["pg_loss"].dtype == torch.float64    # kept on the device
    assert isinstance(acc["is_weight_mean"], float)                                     # floats stay floats
    by_float = {k: sum(float(s[k]) * share for s, share in micro) for k in micro[0][0]}
    out = read_back(acc)
    assert out == by_float                                 # the same fp64 arithmetic, to the bit
    assert out["pg_loss"] == 0.25 * 0.375 - 0.125 * 0.625


def test_read_back_of_nothing_is_empty():
    assert read_back({}) == {}


def test_summary_counts_nonfinite_norms_as_skipped_steps():
    # three minibatches, the second's gradient norm NaN (no optimizer step): its loss statistics
    # still count in the per-minibatch means, its norm does not
    out = update_summary({"loss": 3.0}, [1.0, float("nan"), 3.0])
    assert out == {"loss": 1.0, "grad_norm": 2.0, "optimizer_steps": 2, "skipped_nonfinite_grad": 1}
    out = update_summary({}, [float("inf")])
    assert math.isnan(out.pop("grad_norm")) and out == {"optimizer_steps": 0, "skipped_nonfinite_grad": 1}
