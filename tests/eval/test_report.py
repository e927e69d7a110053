"""`agentq report`'s pieces computed without a browser (the rendered page: tests/trainer/test_run_outputs.py)."""
import re

import pytest

from agentq.eval.report import by_turn_section, viewer_steps


def test_the_alpha_by_turn_table_shows_the_median_of_an_even_count():
    rows = [{"step": 1, "k3_by_turn": [0.1]}]
    # two trajectories' first turns: the median of α 0.5 and 0.9 is 0.7 (not the upper middle, 0.9)
    segs = {1: [{"turn": 1, "tokens": 3, "alpha": 0.5}, {"turn": 1, "tokens": 2, "alpha": 0.9},
                {"turn": 1, "tokens": 0, "alpha": 0.1}]}     # no action token: not counted
    table = re.search(r"<table id='alpha-by-turn'>.*?</table>", by_turn_section(rows, segs), re.S).group(0)
    assert re.findall(r"<td[^>]*>([^<]*)</td>", table)[1] == "0.700"


def test_viewer_steps_spread_over_the_run_for_every_k():
    steps = [1, 2, 3, 4, 5, 6, 7]
    assert viewer_steps(steps, 4) == [1, 3, 5, 7]
    assert viewer_steps(steps, 2) == [1, 7]
    assert viewer_steps(steps, 1) == [7]
    assert viewer_steps(steps, 0) == []
    assert viewer_steps([3], 4) == [3]


def _pipeline_folder(root):
    """What `agentq pipeline` leaves: rl/ (the RL run) and summary.json, no metrics.jsonl on top."""
    import json

    (root / "rl").mkdir(parents=True)
    (root / "rl" / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 0.0, "eval/success_rate": 0.5}) + "\n")
    split = {"episodes": 4, "sft_success_rate": 0.25, "rl_success_rate": 0.5, "sft_success_ci95": [0.05, 0.7],
             "rl_success_ci95": [0.15, 0.85], "paired": {"won_only_after": 2, "won_only_before": 1, "mcnemar_p": 1.0}}
    summary = {"split": "dev", **split, "other_splits": {"test": split}, "algo": "interq", "rollout_quant": "w8a8_kv8",
               "sft_demos": 8, "rl_steps": 1}
    (root / "summary.json").write_text(json.dumps(summary))


def test_a_pipeline_folder_is_reported_with_its_sft_to_rl_summary(tmp_path):
    """`agentq pipeline` prints its folder; `agentq report <that folder>` said "not an agentq run folder"."""
    from agentq.cli import main

    _pipeline_folder(tmp_path / "pipe")
    assert main(["report", str(tmp_path / "pipe")]) == 0
    page = (tmp_path / "pipe" / "report.html").read_text()
    table = re.search(r"<table id='pipeline-table'>.*?</table>", page, re.S).group(0)
    rows = re.findall(r"<tr><td class=l>(\w+)</td>((?:<td>[^<]*</td>)+)</tr>", table)
    assert [r[0] for r in rows] == ["dev", "test"]
    assert re.findall(r"<td>([^<]*)</td>", rows[0][1]) == ["4", "0.250", "0.050–0.700", "0.500", "0.150–0.850",
                                                             "2 / 1", "1.000"]
    assert "agentq run pipe:" in page and "href='#pipeline'" in page
    assert "8 expert demonstrations, 1 RL steps (interq, rollout w8a8_kv8)." in page     # no rollout_backend: older
    assert "Paired p (two-sided, over tasks): exact McNemar.</p>" in page      # no test recorded: older, McNemar's


def test_the_pipeline_table_names_the_paired_tests_used(tmp_path):
    import json

    from agentq.eval.report import pipeline_section

    _pipeline_folder(tmp_path / "pipe")
    summary = json.loads((tmp_path / "pipe" / "summary.json").read_text())
    summary["paired"] = {**summary["paired"], "test": "exact sign-flip over tasks"}
    summary["other_splits"]["test"]["paired"]["test"] = "exact McNemar"
    page = pipeline_section(summary)
    assert "<th>tasks better after RL / after SFT</th><th>paired p</th>" in page
    assert "Paired p (two-sided, over tasks): exact McNemar, exact sign-flip over tasks.</p>" in page


def test_a_pipeline_summary_names_the_rollout_backend(tmp_path):
    import json

    from agentq.eval.report import write_report

    _pipeline_folder(tmp_path / "pipe")
    summary = json.loads((tmp_path / "pipe" / "summary.json").read_text())
    (tmp_path / "pipe" / "summary.json").write_text(json.dumps({**summary, "rollout_backend": "vllm"}))
    page = write_report(tmp_path / "pipe").read_text()
    assert "8 expert demonstrations, 1 RL steps (interq, rollout w8a8_kv8 (vllm))." in page


def test_a_folder_that_is_no_run_names_both_kinds(tmp_path):
    from agentq.eval.report import write_report

    with pytest.raises(FileNotFoundError, match="no metrics.jsonl, nor rl/metrics.jsonl of an `agentq pipeline` folder"):
        write_report(tmp_path)
