"""The pieces of `eval/bench_kernels.py` that run without a GPU: the GEMM table's text format,
the split launches the partial-sums sweeps try, the spread launches and how their rows are
written, and the read probe's kernel (interpreted)."""
import json

import pytest
import torch

from agentq.eval import bench_kernels
from agentq.eval.bench_kernels import MODEL_LINEARS, partials_candidates, spread_candidates, table_json
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


def test_spread_candidates_cover_their_columns_with_one_tile():
    for model in ("qwen3-8b", "qwen3-1.7b"):
        for lin in ("qkv", "gate_up"):
            n = MODEL_LINEARS[model][lin][1]
            for m in (64, 128):
                cands = list(spread_candidates(m, n))
                assert cands, (model, lin, m)
                for c in cands:
                    cols, programs = triton_gemm.column_split(n, c, 132)
                    assert c.spread in (1, 2) and c.split_k == 1 and c.persistent == 0
                    assert cols < c.block_n < 4 * cols and programs <= c.spread * 132    # a masked tile each
                    assert (c.block_m + c.block_n) * c.block_k * c.num_stages <= 200 << 10


def test_spread_rows_merge_into_the_table_per_m(tmp_path, monkeypatch):
    """`bench_spread --write-table` replaces only the measured M's rows of a "gemm" shape, and gives
    a "glu" shape its kept rows plus the plain launch below them; the file and the loaded tables agree."""
    path = tmp_path / "h200_gemm.json"
    path.write_text(table_json({"_about": "x", "gemm": {"96x32": [[16, [16, 32, 32, 1, 8, 4, 2]],
                                                                  [64, [64, 32, 32, 1, 8, 4, 2]],
                                                                  [128, [64, 64, 32, 1, 8, 4, 2]]]},
                                "glu": {}, "partials": {}}))
    monkeypatch.setattr(triton_gemm, "TABLE_FILE", path)
    gemm_table = triton_gemm.load_table(path)
    monkeypatch.setattr(triton_gemm, "H200_TABLE", gemm_table)
    monkeypatch.setattr(triton_gemm, "H200_GLU_TABLE", {})
    spread = triton_gemm.GemmConfig(64, 64, 32, 1, 8, 4, 3, 0, 1)
    results: dict = {}
    bench_kernels._write_spread_rows({"96x32": {64: spread.table_row()}}, {"96x32": {128: spread.table_row()}},
                                     results, write_table=True)
    raw = json.loads(path.read_text())
    assert raw["gemm"]["96x32"] == [[16, [16, 32, 32, 1, 8, 4, 2]], [64, spread.table_row()],
                                    [128, [64, 64, 32, 1, 8, 4, 2]]]
    assert raw["glu"]["96x32"] == [[64, [64, 32, 32, 1, 8, 4, 2]], [128, spread.table_row()]]
    assert triton_gemm.pick_config(64, 96, 32) == spread == triton_gemm.glu_config(100, 96, 32)
    assert results["spread_table"]["gemm"] == {"96x32": raw["gemm"]["96x32"]}


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
        # split over programs (grid b x h x S), chunks of whole tiles: every row read exactly once
        # (an XOR counts a row read twice as not read), also for S that do not divide the tiles
        for splits in (2, 3, 5):
            parts = torch.empty(b * h * splits, dtype=torch.int32)
            bk._read_tiles_kernel[(b, h, splits)](kw, vw, *descs, parts, length, length, BLOCK_N=16, WORDS=words,
                                                  TMA=tma)
            got = torch.zeros(b * h, dtype=torch.int32)
            for col in parts.reshape(b * h, splits).unbind(1):
                got ^= col
            assert torch.equal(got, want), splits
        # one stream: K and V words side by side in one row, read through the K pointer / descriptor
        kv = torch.cat([kw, vw], dim=-1).contiguous()
        desc = TensorDescriptor(kv, [kv.numel() // (2 * words), 2 * words], [2 * words, 1], [16, 2 * words])
        bk._read_tiles_kernel[(b, h)](kv, kv, desc, desc, out, length, length, BLOCK_N=16, WORDS=2 * words,
                                      TMA=tma, ONE_STREAM=True)
        want_kv = torch.zeros(b * h, dtype=torch.int32)
        for col in kv.reshape(b * h, -1).unbind(1):
            want_kv ^= col
        assert torch.equal(out, want_kv)
    finally:
        _interp.restore_compiled(mods)
