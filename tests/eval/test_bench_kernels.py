"""The pieces of `eval/bench_kernels.py` that run without a GPU: the GEMM table's text format,
the split launches the partial-sums sweeps try, and the read probe's kernel (interpreted)."""
import json

import pytest
import torch

from agentq.eval.bench_kernels import MODEL_LINEARS, partials_candidates, table_json
from agentq.kernels import triton_gemm


def test_table_json_writes_the_table_file_as_it_is():
    """Rewriting kernels/h200_gemm.json from its parsed JSON gives the very file (one row per line),
    so `--write-table` changes only the rows it measured; and a new section reads back."""
    text = triton_gemm.TABLE_FILE.read_text()
    raw = json.loads(text)
    assert table_json(raw) == text
    raw["partials"]["8x16"] = [[64, [64, 16, 32, 2, 8, 4, 3]]]
    again = table_json(raw)
    assert json.loads(again) == raw and '\n   [64, [64, 16, 32, 2, 8, 4, 3]]\n' in again


def test_partials_candidates_split_k_into_whole_steps_over_enough_programs():
    for model, lin in (("qwen3-8b", "o"), ("qwen3-8b", "down"), ("qwen3-1.7b", "down")):
        k, n = MODEL_LINEARS[model][lin]
        for wide in (False, True):
            cands = list(partials_candidates(64, n, k, wide))
            assert cands, (model, lin, wide)
            for c in cands:
                programs = -(-n // c.block_n) * c.split_k
                assert c.split_k > 1 and k // c.block_k >= 2 * c.split_k       # each split ≥ 2 K steps
                assert (200 if wide and c.block_k < 512 else 96) <= programs <= (600 if wide else 270)
                assert (c.block_m + c.block_n) * c.block_k * c.num_stages <= 227 << 10     # fits an SM


@pytest.mark.parametrize("tma", [True, False])
def test_read_probe_kernel_reads_every_word_of_its_rows(tma):
    """`--attn-reads` times `_read_tiles_kernel`: program (b, h) must read all `length` rows of its
    K and V words (here by TMA tiles and by pointer) — its XOR of them equals torch's."""
    pytest.importorskip("triton")
    from triton.tools.tensor_descriptor import TensorDescriptor

    from agentq.kernels import _interp
    mods = ("agentq.eval.bench_kernels",)
    bk = _interp.load_interpreted(mods)[0]
    try:
        b, h, length, words = 2, 3, 48, 4
        g = torch.Generator().manual_seed(0)
        kw, vw = (torch.randint(-2**31, 2**31 - 1, (b, h, length, words), generator=g, dtype=torch.int32)
                  for _ in range(2))
        descs = [TensorDescriptor(c, [c.numel() // words, words], [words, 1], [16, words]) for c in (kw, vw)]
        out = torch.empty(b * h, dtype=torch.int32)
        bk._read_tiles_kernel[(b, h)](kw, vw, *descs, out, length, length, BLOCK_N=16, WORDS=words, TMA=tma)
        want = torch.zeros(b * h, dtype=torch.int32)
        for col in (kw ^ vw).reshape(b * h, -1).unbind(1):
            want ^= col
        assert torch.equal(out, want)
    finally:
        _interp.restore_compiled(mods)
