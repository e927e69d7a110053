"""`agentq report`'s pieces computed without a browser (the rendered page: tests/trainer/test_run_outputs.py)."""
import contextlib
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
    assert "8 expert demonstrations, 1 RL step (interq, rollout w8a8_kv8)." in page     # no rollout_backend: older
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
    # a split whose two evaluations share no task: no test (an older summary.json recorded McNemar's p = 1)
    summary["other_splits"]["test"]["paired"] = {"pairs": 0, "won_only_after": 0, "won_only_before": 0,
                                                 "mcnemar_z": 0.0, "mcnemar_p": 1.0, "test": "exact McNemar"}
    page = pipeline_section(summary)
    assert "<td>–</td><td>no shared tasks</td></tr>" in page
    assert "Paired p (two-sided, over tasks): exact sign-flip over tasks.</p>" in page


def test_a_pipeline_summary_names_the_rollout_backend(tmp_path):
    import json

    from agentq.eval.report import write_report

    _pipeline_folder(tmp_path / "pipe")
    summary = json.loads((tmp_path / "pipe" / "summary.json").read_text())
    (tmp_path / "pipe" / "summary.json").write_text(json.dumps({**summary, "rollout_backend": "vllm"}))
    page = write_report(tmp_path / "pipe").read_text()
    assert "8 expert demonstrations, 1 RL step (interq, rollout w8a8_kv8 (vllm))." in page
    # rollout=bf16 (rollout_quant "none") named as its evaluation folders name it
    (tmp_path / "pipe" / "summary.json").write_text(json.dumps({**summary, "rollout_quant": "none",
                                                                "rollout_backend": "torch"}))
    assert "(interq, rollout bf16 (torch))." in write_report(tmp_path / "pipe").read_text()


def test_a_folder_that_is_no_run_names_both_kinds(tmp_path):
    from agentq.eval.report import write_report

    with pytest.raises(FileNotFoundError, match="no metrics.jsonl, nor rl/metrics.jsonl of an `agentq pipeline` folder"):
        write_report(tmp_path)


def _seg(step, turn, tokens, *, episode=0, alpha=0.5, obs="o", text=None, task="t", end="won", delta=0.0,
         logp=-0.5, k3_sum=1e-5, action="a", feedback="f"):
    """One segment row (eval/segments.py's columns)."""
    return {"step": step, "row": episode, "episode_id": episode, "task_id": task, "group_id": 0, "turn": turn,
            "tokens": tokens, "delta_sum": delta * tokens, "k3_sum": k3_sum, "m": k3_sum, "H": 0.0, "alpha": alpha,
            "d": 0.0, "reward": 1.0, "advantage": 0.5, "won": end == "won", "task_type": None, "end_reason": end,
            "observation": obs, "assistant": "a", "action": action, "feedback": feedback, "token_ids": [1] * tokens,
            "token_text": text, "logp_behaviour": [logp] * tokens, "logp_old": [logp] * tokens, "delta": [delta] * tokens}


def _run(root, rows, segments=()):
    import json

    from agentq.eval.segments import write_segments

    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    by_step: dict[int, list] = {}
    for s in segments:
        by_step.setdefault(s["step"], []).append(s)
    for step, segs in by_step.items():
        write_segments(root, step, segs)
    return root


def test_episode_text_cannot_break_out_of_the_page(tmp_path):
    """Observations, token texts, actions, feedback, task ids and end reasons are environment (or model)
    text: `<script>` or `</textarea>` in them is shown, never parsed. The end reason went in raw."""
    from agentq.eval.report import write_report

    evil = "</textarea><script>alert('obs')</script><!-- ' \" &"
    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5,
                                   "k3_by_turn": [1e-5]}],
               [_seg(1, 1, 2, obs=evil, text=["<script>", "</textarea>'"], task="<img src=x onerror=alert(2)>",
                     end="<b onclick=alert(3)>cap</b>", action="<i>act</i>", feedback="</div></details>")])
    (run / "config.yaml").write_text("env:\n  name: \"<script>env</script>\"\nalgo:\n  name: \"a'b\"\n")
    page = write_report(run).read_text()
    assert page.count("<script") == 1 and page.count("</script>") == 1      # the page's own colour switch
    assert "<b onclick" not in page and "<img src=x" not in page and "<i>act</i>" not in page
    assert "&lt;b onclick=alert(3)&gt;cap&lt;/b&gt;" in page                 # the end reason, shown as text
    assert ("<div class=obs>&lt;/textarea&gt;&lt;script&gt;alert(&#x27;obs&#x27;)&lt;/script&gt;&lt;!-- &#x27; "
            "&quot; &amp;</div>") in page
    assert ">&lt;script&gt;</span>" in page and ">&lt;/textarea&gt;&#x27;</span>" in page
    assert "→ &lt;/div&gt;&lt;/details&gt;</div>" in page
    assert page.count("<details") == page.count("</details>") == 1


def test_token_markup_is_a_class_per_colour(tmp_path):
    """Each token carried three inline colours and α in its tooltip, ~150 bytes: a long run's viewer
    (16 episodes × 4 steps × turns × tokens) ran to many MB. Now two classes and log μ, δ (α is the
    turn's, in its header and its bar)."""
    from agentq.eval.report import token_css, token_span, write_report

    # δ at half the colour scale, positive: p5; log μ = −2.5 of the −5 that saturates: l5
    assert token_span("<a>", -2.5, 0.5e-6, 1e-6) == "<span class='t p5 l5' title='log μ = -2.5000  δ = 5e-07'>&lt;a&gt;</span>"
    assert token_span("x", 0.0, -2e-6, 1e-6) == "<span class='t n10' title='log μ = 0.0000  δ = -2e-06'>x</span>"
    assert token_span("x", -0.01, 0.0, 0.0) == "<span class=t title='log μ = -0.0100  δ = 0'>x</span>"
    css = token_css()
    assert "body.by-delta .p5{background:rgba(220,40,40,0.5)}" in css
    assert "body.by-delta .n10{background:rgba(40,90,220,1)}" in css
    assert "body.by-logp .l5{background:rgba(230,140,0,0.5)}" in css
    # the page grows by the tokens' markup alone: 2,000 more tokens of one episode, < 75 bytes each
    metrics = [{"step": 1, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5, "k3_by_turn": [1e-5]}]
    sizes = [len(write_report(_run(tmp_path / str(n), metrics, [_seg(1, 1, n, text=["ab"] * n, delta=1e-7 * (n > 0),
                                                                      logp=-1.234)])).read_text()) for n in (10, 2010)]
    assert (sizes[1] - sizes[0]) / 2000 < 75


def test_a_long_runs_by_turn_tables_show_steps_spread_over_it(tmp_path):
    """K3 and α by turn had one row per step: 1,000 steps × 30 turns × 2 tables, MBs of cells."""
    from agentq.eval.report import write_report

    rows = [{"step": s, "reward_mean": 0.0, "success_rate": 0.0, "k3": s * 1e-6, "k3_by_turn": [s * 1e-6, 2 * s * 1e-6]}
            for s in range(1, 101)]
    segs = [_seg(s, t, 2, alpha=1 - s / 1000) for s in range(1, 101) for t in (1, 2)]
    page = write_report(_run(tmp_path / "run", rows, segs), table_rows=5).read_text()
    k3 = re.search(r"<table id='k3-by-turn'>.*?</table>", page, re.S).group(0)
    alpha = re.search(r"<table id='alpha-by-turn'>.*?</table>", page, re.S).group(0)
    want = [1, 26, 51, 75, 100]                  # viewer_steps(1..100, 5): first, last and spread between
    for table in (k3, alpha):
        assert [int(s) for s in re.findall(r"<tr><td>(\d+)</td>", table)] == want
    assert re.findall(r"<tr><td>75</td><td[^>]*>([^<]*)</td><td[^>]*>([^<]*)</td>", k3) == [("7.5e-05", "0.00015")]
    assert re.findall(r"<tr><td>75</td><td[^>]*>([^<]*)</td>", alpha) == ["0.925"]
    assert "5 of the run's 100 steps, spread over it" in page
    # a short run keeps every row, without the note
    page = write_report(_run(tmp_path / "short", rows[:3], segs[:6])).read_text()
    k3 = re.search(r"<table id='k3-by-turn'>.*?</table>", page, re.S).group(0)
    assert [int(s) for s in re.findall(r"<tr><td>(\d+)</td>", k3)] == [1, 2, 3] and "spread over it" not in page


@pytest.mark.parametrize("case", ["empty", "one_step_no_eval", "null_metrics", "eval_of_no_episode", "torn_line"])
def test_a_report_renders_whatever_the_run_has_so_far(tmp_path, case):
    """A run stopped early, before its first evaluation, after one step, with NaN metrics (null in
    metrics.jsonl) or an evaluation of no episode: every section renders, saying what is missing."""
    import json

    from agentq.eval.report import write_report

    step = {"step": 1, "reward_mean": 0.25, "success_rate": 0.5, "k3": 1e-5, "k3_by_turn": [1e-5]}
    run = tmp_path / "run"
    if case == "empty":
        _run(run, [])
    elif case == "one_step_no_eval":
        _run(run, [step], [_seg(1, 1, 2)])
    elif case == "null_metrics":
        _run(run, [{"step": 1, "reward_mean": None, "success_rate": None, "k3": None, "k3_by_turn": [None, 1e-5],
                    "alpha_median": None}, step | {"step": 2}], [_seg(1, 1, 2, alpha=None)])
    elif case == "eval_of_no_episode":
        _run(run, [step, {"step": 1, "eval/success_rate": None, "eval/episodes": 0}])
        (run / "eval" / "step_000001").mkdir(parents=True)
        (run / "eval" / "step_000001" / "eval.json").write_text(json.dumps(
            {"step": 1, "split": "dev", "episodes": 0, "success_rate": None, "success_ci95": [None, None]}))
    else:
        _run(run, [step])
        with (run / "metrics.jsonl").open("a") as f:
            f.write('{"step": 2, "rew')                         # killed mid-write
    with pytest.warns(UserWarning, match="torn last line") if case == "torn_line" else contextlib.nullcontext():
        page = write_report(run).read_text()
    expect = {"empty": ["No training steps in metrics.jsonl.", "No evaluations in this run.",
                        "No k3_by_turn in metrics.jsonl.", "No segment history"],
              "one_step_no_eval": ["<img alt='learning curve'", "No evaluations in this run.",
                                   "<table id='k3-by-turn'>", "Step 1 (1 trajectory)"],
              "null_metrics": ["<img alt='learning curve'", "<tr><td>1</td><td style='background:none'>–</td>",
                               "No evaluations in this run.", "· 2 steps</h1>"],
              "eval_of_no_episode": ["<tr><td>1</td><td class=l>dev</td><td>0</td><td>–</td><td>–––</td>"],
              "torn_line": ["· 1 step</h1>", "<img alt='learning curve'"]}[case]
    for text in expect:
        assert text in page, text


def test_a_pipeline_reports_curve_has_the_sft_level_of_its_size(tmp_path, monkeypatch):
    """The pipeline's own learning_curve.png draws SFT's success; the report's curve of the same run
    did not."""
    import agentq.eval.plots as plots
    from agentq.eval.report import write_report

    _pipeline_folder(tmp_path / "pipe")
    (tmp_path / "pipe" / "rl" / "metrics.jsonl").write_text(
        '{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}\n{"step": 1, "eval/success_rate": 0.5, "eval/episodes": 4}\n')
    calls = []
    real = plots.learning_curve_figure
    monkeypatch.setattr(plots, "learning_curve_figure", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    write_report(tmp_path / "pipe")
    assert [(c["sft_success"], c["sft_episodes"]) for c in calls] == [(0.25, 4)]


def test_reading_a_run_folder_unpickles_nothing(tmp_path, monkeypatch):
    """The report (and the sweep table) read JSON, YAML (safe) and Parquet only; a checkpoint's
    trainer_state.pt beside them is never opened."""
    import pickle

    import torch

    from agentq.eval.report import write_report

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5,
                                   "k3_by_turn": [1e-5]}], [_seg(1, 1, 2)])
    (run / "config.yaml").write_text("env:\n  name: e\nalgo:\n  name: a\n")
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "trainer_state.pt").write_bytes(pickle.dumps({"x": 1}))

    def refuse(*a, **kw):
        raise AssertionError("a pickle was loaded")

    for mod, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(mod, name, refuse)
    assert "agentq run run: e · a · 1 step" in write_report(run).read_text()


def test_the_title_names_the_env_configs_tasks_and_headings_count_in_the_singular(tmp_path):
    """Both TextWorldExpress configs are `name: textworld_express`: the mapreader sweep's runs were
    titled as coin's. Headings read "1 steps", "1 trajectories", "1 turns"."""
    from agentq.eval.report import write_report

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5,
                                   "k3_by_turn": [1e-5]}], [_seg(1, 1, 1)])
    (run / "config.yaml").write_text("env:\n  name: textworld_express\n  kwargs: {games: [mapreader], jvm_heap: 1g}\n"
                                     "algo:\n  name: interq\n")
    page = write_report(run).read_text()
    assert "<h1 id='title'>agentq run run: textworld_express[mapreader] · interq · 1 step</h1>" in page
    assert "<h3 id='step-1'>Step 1 (1 trajectory)</h3>" in page and " · 1 turn</summary>" in page


def test_an_evaluation_whose_eval_json_does_not_match_its_episodes_is_left_out_by_name(tmp_path, capsys):
    """eval.json records its episodes' sha256; the report read eval.json alone, so a summary beside
    other episodes (replaced, edited) went into the table. That evaluation's row is left out, with the
    one-line reason in the page and on stderr; the others are reported."""
    import json
    from hashlib import sha256

    from agentq.agent.trajectory import Trajectory
    from agentq.eval.evaluate import write_eval
    from agentq.eval.metrics import summarize
    from agentq.eval.report import write_report

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    for step, won in ((1, 1), (2, 2)):
        trajs = [Trajectory(episode_id=i, task_id=f"t{i}", split="dev", turns=1, won=i < won) for i in range(2)]
        write_eval(run / "eval" / f"step_{step:06d}", {"step": step, "split": "dev", **summarize(trajs)}, trajs)
    episodes = run / "eval" / "step_000002" / "episodes.jsonl"
    episodes.write_text(episodes.read_text().splitlines()[0] + "\n")          # one episode of two
    page = write_report(run).read_text()
    sha = json.loads((episodes.parent / "eval.json").read_text())["episodes_sha256"][:12]
    error = (f"{episodes.parent}: eval.json does not describe the episodes.jsonl beside it (eval.json: 2 episodes, "
             f"sha256 {sha}; episodes.jsonl: 1 line, sha256 {sha256(episodes.read_bytes()).hexdigest()[:12]}): one "
             "was replaced or edited after the evaluation; rerun it")
    assert f"<p class=meta>left out: {error}</p>" in page
    assert re.findall(r"<tr><td>(\d+)</td><td class=l>dev</td>", page) == ["1"]
    assert f"warning: {error}" in " ".join(capsys.readouterr().err.split())


def _evaluation(folder, won, **report):
    """An evaluation folder as `agentq eval` or the trainer writes it (eval.json with its episodes' sha256)."""
    from agentq.agent.trajectory import Trajectory
    from agentq.eval.evaluate import write_eval
    from agentq.eval.metrics import summarize

    trajs = [Trajectory(episode_id=i, task_id=f"t{i}", split="test", turns=1, won=i < won) for i in range(2)]
    write_eval(folder, {"split": "test", **report, **summarize(trajs)}, trajs)


def test_agentq_eval_results_in_the_checkpoints_are_reported(tmp_path, capsys):
    """`agentq eval checkpoint=<run>/checkpoints/step_N` writes eval-<env>-<split>[-settings] into the
    checkpoint; the report's evaluations were eval/step_* only. Each is a row naming its checkpoint,
    folder and settings; one whose eval.json does not match its episodes is left out by name."""
    from agentq.eval.report import write_report

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    _evaluation(run / "eval" / "step_000002", 1, step=2)
    ckpts = run / "checkpoints"
    _evaluation(ckpts / "step_000002" / "eval-guess-test", 2, rollout_quant="w8a8_kv8", rollout_backend="torch",
                sampling={"temperature": 0.0, "repeats": 1})
    _evaluation(ckpts / "step_000004" / "eval-guess-test-bf16-T1-x2", 1, rollout_quant="none",
                rollout_backend="vllm", sampling={"temperature": 1.0, "repeats": 2})
    _evaluation(ckpts / "step_000004" / "eval-guess-dev", 0, rollout_quant="w8a8_kv8")
    broken = ckpts / "step_000004" / "eval-guess-dev" / "episodes.jsonl"
    broken.write_text(broken.read_text().splitlines()[0] + "\n")           # one episode of two
    page = write_report(run).read_text()
    table = re.search(r"<table id='checkpoint-eval-table'>.*?</table>", page, re.S).group(0)
    rows = re.findall(r"<tr><td class=l>([^<]*)</td><td class=l>([^<]*)</td><td class=l>([^<]*)</td>"
                      r"<td class=l>([^<]*)</td><td>(\d+)</td><td>([^<]*)</td>", table)
    assert rows == [("step 2", "eval-guess-test", "test", "w8a8_kv8, greedy", "2", "1.000"),
                    ("step 4", "eval-guess-test-bf16-T1-x2", "test", "bf16 (vllm), T=1, ×2", "2", "0.500")]
    assert re.findall(r"<tr><td>(\d+)</td><td class=l>test</td>", page) == ["2"]       # the trainer's, as before
    said = " ".join(capsys.readouterr().err.split())
    assert f"<p class=meta>left out: {broken.parent}: eval.json does not describe the episodes.jsonl" in page
    assert f"warning: {broken.parent}: eval.json does not describe the episodes.jsonl" in said


def test_a_pipelines_report_has_the_agentq_eval_results_of_its_checkpoints(tmp_path):
    """A pipeline's RL checkpoints (rl/checkpoints/step_*) and its SFT checkpoint (sft/checkpoint)."""
    from agentq.eval.report import write_report

    top = tmp_path / "pipe"
    _pipeline_folder(top)
    _evaluation(top / "sft" / "checkpoint" / "eval-guess-test", 0, rollout_quant="w8a8_kv8")
    _evaluation(top / "rl" / "checkpoints" / "step_000001" / "eval-guess-test", 1, rollout_quant="w8a8_kv8")
    page = write_report(top).read_text()
    table = re.search(r"<table id='checkpoint-eval-table'>.*?</table>", page, re.S).group(0)
    assert re.findall(r"<tr><td class=l>([^<]*)</td><td class=l>([^<]*)</td>", table) == [
        ("SFT", "eval-guess-test"), ("step 1", "eval-guess-test")]
    assert "<p>None during training (eval/step_*).</p>" in page


@pytest.mark.parametrize("given,what,run", [
    ("run/checkpoints/step_000002/eval-guess-test", "an evaluation's output folder (eval.json)", "run"),
    ("run/checkpoints/step_000002", "a checkpoint", "run"),
    ("run/checkpoints", "the checkpoints folder", "run"),
    ("run/eval/step_000002", "an evaluation's output folder (eval.json)", "run"),
    ("pipe/rl/checkpoints/step_000001", "a checkpoint", "pipe"),          # the pipeline's, with its summary
    ("pipe/sft/checkpoint/eval-guess-test", "an evaluation's output folder (eval.json)", "pipe"),
    ("pipe/eval_sft_dev", "an evaluation's output folder (eval.json)", "pipe")])
def test_report_of_a_folder_inside_a_run_names_the_run_folder(tmp_path, capsys, monkeypatch, given, what, run):
    """`agentq report <checkpoint>/eval-guess-test` said "is not an agentq run folder", no more."""
    from agentq.cli import main

    _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    _pipeline_folder(tmp_path / "pipe")
    (tmp_path / "run" / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step_000002" / "config.json").write_text("{}")
    (tmp_path / "pipe" / "rl" / "checkpoints" / "step_000001").mkdir(parents=True)
    for folder in ("run/checkpoints/step_000002/eval-guess-test", "run/eval/step_000002",
                   "pipe/sft/checkpoint/eval-guess-test", "pipe/eval_sft_dev"):
        _evaluation(tmp_path / folder, 1)
    monkeypatch.chdir(tmp_path)                     # relative, as typed: named back relative
    assert main(["report", given]) == 2
    assert capsys.readouterr().err == (f"agentq: {given} is {what} in the run folder {run}, not a run folder itself: "
                                       f"agentq report {run}\n")
    assert main(["report", str(tmp_path / given)]) == 2
    assert f"in the run folder {tmp_path / run}, not a run folder itself" in capsys.readouterr().err
    typo = f"{given}x"      # a path into the run that does not exist: not "a folder in the run"
    assert main(["report", typo]) == 2
    assert capsys.readouterr().err == f"agentq: {typo}: no such folder (in the run folder {run}: agentq report {run})\n"
    assert main(["report", "runz"]) == 2          # a typo outside any run
    assert capsys.readouterr().err == "agentq: runz: no such folder\n"


def test_report_of_a_sweep_folder_names_its_table_and_its_runs(tmp_path, capsys):
    """`agentq report <a sweep folder>` said only "is not an agentq run folder (no metrics.jsonl, ...)"."""
    from agentq.cli import main

    sweep = tmp_path / "s"
    (sweep / "arms" / "bf16" / "seed_0").mkdir(parents=True)
    (sweep / "arms" / "bf16" / "seed_0" / "metrics.jsonl").write_text("")
    (sweep / "table.md").write_text("| arm |\n")
    assert main(["report", str(sweep)]) == 2
    assert capsys.readouterr().err == (
        f"agentq: {sweep} is an `agentq sweep` folder, not a run: its table is {sweep}/table.md; report one of its "
        f"runs with agentq report {sweep}/arms/<arm>/seed_<n> (e.g. agentq report {sweep}/arms/bf16/seed_0)\n")


def test_report_of_a_run_before_its_first_step_says_it_has_no_results_yet(tmp_path, capsys):
    """`agentq report <run>` of a run before its first logged step (config.yaml, no metrics.jsonl) said
    "is not an agentq run folder": now a run in progress (its lock held) or one that stopped there."""
    import os

    from agentq.cli import main
    from agentq.utils.folder_lock import lock_folder

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    held = lock_folder(run, lambda pid: AssertionError(pid))       # the running agentq process's lock
    try:
        assert main(["report", str(run)]) == 2
        assert capsys.readouterr().err == (
            f"agentq: {run} is held by agentq process pid {os.getpid()} and has no metrics.jsonl yet: a run in "
            "progress is reported once its first RL step is logged\n")
    finally:
        held.close()
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err == (f"agentq: {run} is a run folder with no results yet: its run stopped before "
                                       "logging its first RL step (config.yaml, no metrics.jsonl)\n")
    pipe = tmp_path / "pipe"                # a pipeline stopped in its SFT stage
    (pipe / "sft").mkdir(parents=True)
    (pipe / "sft" / "config.yaml").write_text("seed: 0\n")
    assert main(["report", str(pipe)]) == 2
    assert capsys.readouterr().err == (f"agentq: {pipe} is a run folder with no results yet: its run stopped before "
                                       "logging its first RL step (sft/config.yaml, no metrics.jsonl)\n")
    (pipe / "arms").mkdir()                # a sweep's folder (its sft/ too) holds no run of its own
    assert main(["report", str(pipe)]) == 2
    assert capsys.readouterr().err == (
        f"agentq: {pipe} is an `agentq sweep` folder, not a run: it has no table.md yet (agentq sweep "
        f"sweep.table_only=true sweep.out_dir={pipe} writes the table of its finished runs); report one of its runs "
        f"with agentq report {pipe}/arms/<arm>/seed_<n>\n")
    (run / "config.yaml").unlink()         # a folder of nothing agentq wrote: as before
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err == (f"agentq: {run} is not an agentq run folder (no metrics.jsonl, nor "
                                       "rl/metrics.jsonl of an `agentq pipeline` folder)\n")


def test_report_into_a_folder_is_a_one_line_error(tmp_path, capsys):
    """`agentq report runs/x runs/x`: the second argument is the HTML file; a folder there was an
    IsADirectoryError traceback after the page was rendered."""
    from agentq.cli import main

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    assert main(["report", str(run), str(run)]) == 2
    assert capsys.readouterr().err == (f"agentq: report: '{run}' is a folder; the second argument is the HTML file to "
                                       f"write, e.g. {run / 'report.html'} (left out: <run folder>/report.html)\n")
    assert not (run / "report.html").exists()
    assert main(["report", str(run), str(tmp_path / "page.html")]) == 0 and (tmp_path / "page.html").stat().st_size


def test_a_full_disk_keeps_the_last_whole_report(tmp_path, disk_full_at):
    """report.html was written in place: a full disk mid-write left half a page where the last whole
    report had been. It is now replaced whole, or not at all."""
    from agentq.eval.report import write_report

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    before = write_report(run).read_text()
    cut = disk_full_at("report.html")
    with pytest.raises(OSError, match="No space left"):
        write_report(run)
    assert cut and (run / "report.html").read_text() == before
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".report.html")) == []


def test_a_truncated_eval_json_is_left_out_by_name(tmp_path, capsys):
    """An eval.json cut short (a kill or a full disk mid-write) ended `agentq report` with a
    JSONDecodeError traceback; it is left out, named above the table, as a mismatched one is."""
    from agentq.cli import main

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    for step in (1, 2):
        _evaluation(run / "eval" / f"step_{step:06d}", won=1, step=step)
    eval_json = run / "eval" / "step_000002" / "eval.json"
    eval_json.write_text(eval_json.read_text()[:40])
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    error = re.search(r"<p class=meta>left out: ([^<]*)</p>", page).group(1)
    assert error.startswith(f"{eval_json.parent}: eval.json is damaged (not JSON: ") and "evaluate again" in error
    assert re.findall(r"<tr><td>(\d+)</td><td class=l>test</td>", page) == ["1"]
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("bad", ['{"step": 1}\n{garbage\n{"step": 2}\n', '{"step": 1}\n{"reward_mean": 0.5}\n'],
                         ids=["not-json", "no-step"])
def test_a_damaged_metrics_line_is_a_one_line_error(tmp_path, capsys, bad):
    """A garbled middle line of metrics.jsonl (a ValueError traceback) or a row without "step" (a
    KeyError): `agentq: <file>: line 2 ...`, exit status 2."""
    from agentq.cli import main

    run = _run(tmp_path / "run", [])
    (run / "metrics.jsonl").write_text(bad)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentq: {run / 'metrics.jsonl'}: line 2 ") and err.count("\n") == 1


def test_a_damaged_config_yaml_is_said_and_the_report_renders(tmp_path, capsys):
    """`agentq report` read the run's config.yaml with a bare yaml.safe_load: a garbled one ended it in a
    traceback. Now it warns and renders the page without the settings it would name."""
    from agentq.eval.report import write_report

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    (run / "config.yaml").write_text("env: [unclosed\n")
    assert "<!doctype html>" in write_report(run).read_text()
    err = " ".join(capsys.readouterr().err.split())
    assert f"warning: {run / 'config.yaml'} is damaged (not YAML" in err


def test_evaluation_rows_count_the_episodes_that_errored_or_were_not_played(tmp_path):
    """An evaluation with 1 of 10 episodes errored read "0.000" of "10": the env's failure as the policy's."""
    from agentq.agent.trajectory import Trajectory
    from agentq.eval.evaluate import write_eval
    from agentq.eval.metrics import summarize
    from agentq.eval.report import write_report

    run = _run(tmp_path / "run", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    ends = ["error"] + ["context"] * 2 + ["failed"] * 7
    trajs = [Trajectory(episode_id=i, task_id=f"t{i}", split="test", turns=int(end == "failed"), end_reason=end)
             for i, end in enumerate(ends)]
    write_eval(run / "eval" / "step_000001", {"step": 1, "split": "test", **summarize(trajs)}, trajs)
    page = write_report(run).read_text()
    assert "<tr><td>1</td><td class=l>test</td><td>10 (1 errored, 2 not played)</td><td>0.000</td>" in page
    assert ("<p class=meta id='eval-lost'>errored: the environment failed (each such episode's error is under "
            "\"error\" in its evaluation's episodes.jsonl); not played: the first prompt did not fit "
            "env.max_context_tokens. Both count as lost in the success rate.</p>") in page
    # none lost: the count alone, no note
    clean = _run(tmp_path / "clean", [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5}])
    _evaluation(clean / "checkpoints" / "step_000001" / "eval-guess-test", 1)
    page = write_report(clean).read_text()
    assert "</td><td>2</td><td>0.500</td>" in page and "id='eval-lost'" not in page


def test_skipped_steps_and_errored_training_episodes_are_said_under_the_curves(tmp_path):
    """A skipped step (no update) and the training episodes that errored (left out of the step means)
    appeared nowhere in the report."""
    from agentq.eval.report import MAX_LISTED, training_losses, write_report

    rows = [{"step": 1, "reward_mean": 0.5, "success_rate": 0.5, "errored_episodes": 2, "skipped_step": 0},
            {"step": 2, "reward_mean": None, "success_rate": None, "errored_episodes": 4, "skipped_step": 1},
            {"step": 3, "reward_mean": 0.0, "success_rate": 0.0, "errored_episodes": 0, "skipped_step": 1},
            {"step": 3, "eval/success_rate": 0.5, "eval/errors": 3},         # an evaluation's: not training's
            {"step": 4, "reward_mean": 0.5, "success_rate": 0.5, "errored_episodes": 0, "skipped_step": 0}]
    page = write_report(_run(tmp_path / "run", rows)).read_text()
    assert ("<p class=meta id='training-losses'>Training: 2 steps skipped (no usable episode, no update): 2, 3; "
            "6 episodes errored, in 2 steps (left out of the step means; each one's error is in errors.jsonl).</p>"
            ) in page
    assert training_losses([rows[0]]) == ("<p class=meta id='training-losses'>Training: 2 episodes errored, in 1 "
                                          "step (left out of the step means; each one's error is in errors.jsonl).</p>")
    assert training_losses([rows[0] | {"errored_episodes": 0}, rows[4]]) == ""
    many = [{"step": s, "reward_mean": 0.0, "skipped_step": 1} for s in range(1, MAX_LISTED + 6)]
    assert training_losses(many) == (f"<p class=meta id='training-losses'>Training: {MAX_LISTED + 5} steps skipped "
                                     f"(no usable episode, no update): {', '.join(map(str, range(1, 21)))}, ….</p>")


def test_control_characters_of_token_and_episode_text_are_shown_as_escapes(tmp_path):
    """html.escape passes control characters through: raw in the page (invalid HTML, invisible)."""
    from agentq.eval.report import token_span, write_report

    assert token_span("a\x03", -0.01, 0.0, 0.0) == "<span class=t title='log μ = -0.0100  δ = 0'>a\\x03</span>"
    metrics = [{"step": 1, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5, "k3_by_turn": [1e-5]}]
    run = _run(tmp_path / "run", metrics, [_seg(1, 1, 3, text=["a\x03", "\x1d\x7f<", "\t\n\x85"], obs="x\x00y\n",
                                                task="t\x1b", action="go\x0c", feedback="f\x08")])
    page = write_report(run).read_text()
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", page)
    for shown in (">a\\x03</span>", ">\\x1d\\x7f&lt;</span>", ">\t\n\\x85</span>", "<div class=obs>x\\x00y\n</div>",
                  "task t\\x1b · won", "action: go\\x0c → f\\x08</div>"):
        assert shown in page, shown


def test_a_turn_without_a_parsed_action_says_so(tmp_path):
    from agentq.eval.report import write_report

    metrics = [{"step": 1, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5, "k3_by_turn": [1e-5, 1e-5]}]
    page = write_report(_run(tmp_path / "run", metrics, [_seg(1, 1, 2, action=None, feedback="Say <action>."),
                                                         _seg(1, 2, 2, action="look")])).read_text()
    assert "<div class=meta>no parsable action → Say &lt;action&gt;.</div>" in page
    assert "<div class=meta>action: look → f</div>" in page and "action: None" not in page


def test_a_run_without_retention_shows_neither_interq_numbers_nor_the_alpha_switch(tmp_path):
    """flashrl_tis, bf16, ...: each turn read "m … · H … · α –" (m and H at InterQ-RL's defaults, which
    the run never used) and "colour by retention α" turned every token grey."""
    from agentq.eval.report import write_report

    metrics = [{"step": 1, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5, "k3_by_turn": [1e-5, 1e-5]}]
    segs = [_seg(1, 1, 2, alpha=None, delta=0.25, k3_sum=0.25), _seg(1, 2, 4, alpha=None, delta=-0.5, k3_sum=0.5)]
    page = write_report(_run(tmp_path / "tis", metrics, segs)).read_text()
    heads = re.findall(r"<div class=meta>(turn \d[^<]*)</div>", page)
    assert heads == ["turn 1 · 2 tokens · Σδ 0.500 · Σk3 0.250", "turn 2 · 4 tokens · Σδ -2.000 · Σk3 0.500"]
    assert "id=colour-alpha" not in page and "retention α" not in page and "--alpha" not in page.split("<body")[1]
    # InterQ-RL's run: as before
    page = write_report(_run(tmp_path / "interq", metrics, [_seg(1, 1, 2, alpha=0.75, k3_sum=0.125)])).read_text()
    assert re.findall(r"<div class=meta>(turn \d[^<]*)</div>", page) == [
        "turn 1 · 2 tokens · Σδ 0.000 · m 0.125 · H 0.000 · α 0.750"]
    assert "id=colour-alpha" in page and "style='--alpha:hsl(90,70%,45%)'" in page


@pytest.mark.parametrize("value,shown", [(1.0, "1.000"), (1 - 6e-12, "0.99999999999"), (0.9996, "0.9996"),
                                         (0.99949, "0.999"), (1.0004, "1.0004"), (0.5, "0.500"), (2e-4, "0.0002"),
                                         (None, "–")])
def test_a_value_next_to_one_is_not_shown_as_one(value, shown):
    """α = 1 − 6e-12 (a turn that kept almost all of its weight) read "1.000", as α = 1 exactly."""
    from agentq.eval.report import _fmt

    assert _fmt(value) == shown


def test_the_viewer_leaves_out_a_segment_file_whose_step_has_no_metrics_row(tmp_path):
    """A run killed between writing step 6's segment file and its metrics row: the viewer showed
    "Step 6 (4 trajectories)" under a title of "5 steps". Now it lists only logged steps and names the file."""
    from agentq.eval.report import write_report

    rows = [{"step": s, "reward_mean": 0.0, "success_rate": 0.0, "k3": 1e-5, "k3_by_turn": [1e-5]} for s in range(1, 6)]
    segs = [_seg(s, 1, 2, episode=e) for s in range(1, 7) for e in range(4)]
    page = write_report(_run(tmp_path / "run", rows, segs), viewer_steps_k=10).read_text()
    assert "· 5 steps</h1>" in page
    assert re.findall(r"<h3 id='step-(\d+)'>", page) == ["1", "2", "3", "4", "5"]
    assert "Step 6" not in page and "<tr><td>6</td>" not in page        # nor in the by-turn tables
    assert "metrics.jsonl has no row of the step" in page and "segments/step_000006.parquet" in page
    # the spread of steps ends at the last logged step
    page = write_report(_run(tmp_path / "run", rows, segs), viewer_steps_k=2).read_text()
    assert re.findall(r"<h3 id='step-(\d+)'>", page) == ["1", "5"]
    # no logged step at all: the file is named, and no "Step 1" is shown
    page = write_report(_run(tmp_path / "first", [], segs[:4])).read_text()
    assert "No logged step has a segment history." in page and "segments/step_000001.parquet" in page
    assert "<h3 id='step-1'>" not in page
    # a complete run: no note
    page = write_report(_run(tmp_path / "done", rows, segs[:20])).read_text()
    assert "has no row of the step" not in page
