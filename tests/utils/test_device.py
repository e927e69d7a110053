"""`agentq.utils.device`: host → device copies that skip the stream sync keep `Tensor.to`'s values,
and the host may reuse the source as soon as the call returns (CUDA stages pageable memory).
The CUDA cases skip without a GPU; the CPU cases pin the values and the dtype handling."""
import pytest
import torch

from agentq.utils import device as dev_mod
from agentq.utils.device import device_tensor, to_device

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_to_device_keeps_values_and_converts_dtype():
    t = torch.tensor([[True, False], [False, True]])
    out = to_device(t, "cpu", torch.float32)
    assert out.dtype == torch.float32 and torch.equal(out, t.float())
    ids = torch.arange(6).reshape(2, 3)
    assert to_device(ids, "cpu") is ids                         # already there: no copy, as Tensor.to
    assert to_device(ids, torch.device("cpu"), torch.float64).dtype == torch.float64
    assert torch.equal(device_tensor([[1, 2], [3, 4]], "cpu", torch.int32),
                       torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))


def test_switch_is_read_at_import(monkeypatch):
    """AGENTQ_ASYNC_H2D=0 turns the non-blocking copies off (read once, at import)."""
    import importlib
    before = dev_mod.ASYNC_H2D
    try:
        monkeypatch.setenv("AGENTQ_ASYNC_H2D", "0")
        assert importlib.reload(dev_mod).ASYNC_H2D is False
        monkeypatch.setenv("AGENTQ_ASYNC_H2D", "1")
        assert importlib.reload(dev_mod).ASYNC_H2D is True
    finally:
        dev_mod.ASYNC_H2D = before          # the functions other modules imported read this global


@cuda
def test_source_reused_after_an_async_copy_does_not_change_the_copy():
    """A 64 MB pageable source overwritten right after `to_device` returns, while a long kernel
    still occupies the stream: the device copy holds the values at the call."""
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        big = big @ big / 64.0                                    # keep the stream busy
    src = torch.arange(16 * 2**20, dtype=torch.int32)
    want = src.clone()
    out = to_device(src, "cuda")
    src.fill_(-1)
    assert torch.equal(out.cpu(), want)
    assert torch.isfinite(big).all()


@cuda
def test_device_to_host_copies_still_block():
    """A GPU tensor copied to the host through `to_device` is complete when the call returns
    (a non-blocking device → host copy could be read before it lands)."""
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        x = x @ x / 64.0
    y = (x[:1024] * 0 + 7).to(torch.int32)
    host = to_device(y, "cpu")
    assert host.device.type == "cpu" and bool((host == 7).all())
