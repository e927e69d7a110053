"""What a 2-step `agentq train` leaves for a user to look at: the segment history (Parquet) whose
numbers reproduce the step's metrics and InterQ-RL's retention, PNG curves, W&B (offline) beside
TensorBoard, one plain line per step in a log file, and `agentq report` rendered in headless Chromium."""
from __future__ import annotations

import json
import math
import pytest
import torch

from conftest import NO_CHROMIUM, chromium, headless_chromium, run_cli

SMALL = ["env=textworld_express", "env.max_steps=3", "env.max_new_tokens=12", "trainer.tasks_per_step=2",
         "trainer.group_size=2", "trainer.eval_num_tasks=2", "env_pool.num_workers=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("wandb")
    out = tmp_path_factory.mktemp("run") / "r"
    # with sequence packing (the other CLI runs cover padded micro-batches): the numbers below must
    # still reproduce from the segment history
    p = run_cli(["train", *SMALL, "trainer.steps=2", "trainer.eval_every=1", f"trainer.out_dir={out}",
                 "logger=[tensorboard,wandb]", "wandb.mode=offline", "trainer.pack_tokens=512"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "pack_tokens: 512" in (out / "config.yaml").read_text()
    return out, p


def _metrics(run_dir, step):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["step"] == step and "reward_mean" in r)


def test_segment_totals_reproduce_k3_and_alpha_metrics(run):
    from agentq.eval.segments import read_segments, segment_steps, step_metrics

    run_dir, _ = run
    assert segment_steps(run_dir) == [1, 2]
    for step in (1, 2):
        rows = read_segments(run_dir, steps=[step]).to_pylist()
        m = _metrics(run_dir, step)
        assert len({r["episode_id"] for r in rows}) == m["episodes"] == 4
        assert sum(r["tokens"] for r in rows) == m["action_tokens"]
        for r in rows:
            assert r["tokens"] == len(r["token_ids"]) == len(r["delta"]) == len(r["token_text"])
            assert r["delta_sum"] == pytest.approx(sum(r["delta"]), abs=1e-15)
            # δ = log π_old − log μ, from the stored float32 log-probs
            assert r["delta"] == pytest.approx([o - b for o, b in zip(r["logp_old"], r["logp_behaviour"])],
                                               abs=1e-15)
        derived = step_metrics(rows)
        assert derived["k3"] == pytest.approx(m["k3"], rel=1e-9)
        assert len(derived["k3_by_turn"]) == len(m["k3_by_turn"])
        for a, b in zip(derived["k3_by_turn"], m["k3_by_turn"]):
            assert (a is None or math.isnan(a)) if b is None else a == pytest.approx(b, rel=1e-9)
        for key in ("alpha_min", "alpha_median", "alpha_max", "alpha_p10", "alpha_token_mean"):
            assert derived[key] == pytest.approx(m[key], rel=1e-12), key


def test_steps_log_the_prefill_a_groups_shared_first_turn_saved(run):
    """Each group's episodes share their first-turn prompt (one task): the engine prefills it once
    (rollout.share_prefill, on by default) and the step row counts the copied tokens as shared, a
    part of the cached ones (the rest: each episode's own context from its turns before)."""
    run_dir, _ = run
    for step in (1, 2):
        m = _metrics(run_dir, step)
        assert m["prefill_computed_tokens"] > 0
        assert m["prefill_cached_tokens"] > m["prefill_shared_tokens"] > 0


def test_segment_alpha_and_H_reproduce_interq_retention(run):
    """Rebuild a batch from the file's per-token δ alone and run InterQ-RL's retention on it."""
    import yaml

    from agentq.algos import interq_retention
    from agentq.learner.batch import PolicyBatch
    from agentq.eval.segments import read_segments

    run_dir, _ = run
    params = yaml.safe_load((run_dir / "config.yaml").read_text())["algo"]["objective_params"] or {}
    rows = read_segments(run_dir, steps=[2]).to_pylist()
    by_row: dict[int, list[dict]] = {}
    for r in rows:
        by_row.setdefault(r["row"], []).append(r)
    B = len(by_row)
    L = 1 + max(sum(r["tokens"] for r in rs) for rs in by_row.values())
    mask, seg = torch.zeros(B, L), torch.zeros(B, L, dtype=torch.long)
    delta = torch.zeros(B, L, dtype=torch.float64)
    for i, rs in enumerate(by_row[k] for k in sorted(by_row)):
        pos = 1                                   # position 0 never carries an action
        for r in sorted(rs, key=lambda r: r["turn"]):
            n = r["tokens"]
            mask[i, pos: pos + n], seg[i, pos: pos + n] = 1.0, r["turn"]
            delta[i, pos: pos + n] = torch.tensor(r["delta"], dtype=torch.float64)
            pos += n
    batch = PolicyBatch(input_ids=torch.zeros(B, L, dtype=torch.long), attention_mask=torch.ones(B, L),
                        action_mask=mask, seg_id=seg, rollout_logp=torch.zeros(B, L, dtype=torch.float64),
                        adv=torch.zeros(B), old_logp=delta)
    ret = interq_retention(batch, **{k: v for k, v in params.items() if k in
                                      ("budget_B", "H_floor", "budget_scope", "prefix_inclusive", "k3_max")})
    assert any(r["alpha"] < 1 for r in rows)             # a real mismatch, so α is not trivially 1
    for i, rs in enumerate(by_row[k] for k in sorted(by_row)):
        for r in rs:
            assert r["alpha"] == pytest.approx(float(ret.alpha[i, r["turn"] - 1]), abs=1e-12)
            assert r["H"] == pytest.approx(float(ret.H[i, r["turn"] - 1]), abs=1e-12)
            assert r["m"] == pytest.approx(float(ret.m[i, r["turn"] - 1]), abs=1e-12)


def test_pngs_wandb_offline_and_plain_step_lines(run):
    run_dir, proc = run
    for name in ("learning_curve.png", "mismatch.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    lines = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"] and "reward 0." in lines[0]
    # the offline W&B run's record file holds our scalar keys (train and eval), not the lists
    (rec,) = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    data = rec.read_bytes()
    for key in (b"reward_mean", b"alpha_median", b"eval/success_rate", b"kv_bytes_per_token"):
        assert key in data, key
    assert b"k3_by_turn" not in data


@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_report_renders_in_headless_chromium(run, tmp_path):
    driver = headless_chromium(tmp_path / "chromium-profile")
    from selenium.webdriver.common.by import By

    from agentq.eval.report import VISIBLE_CONTROLS, alpha_colour
    from agentq.eval.segments import read_segments

    run_dir, _ = run
    p = run_cli(["report", str(run_dir)])
    assert p.returncode == 0, p.stderr[-3000:]
    page = run_dir / "report.html"
    assert p.stdout.strip() == str(page)
    try:
        driver.get(page.as_uri())
        assert driver.find_element(By.ID, "title").text.endswith("textworld_express[coin] · interq · 2 steps")
        imgs = driver.find_elements(By.CSS_SELECTOR, "#curves ~ img")
        assert len(imgs) == 2 and all(driver.execute_script("return arguments[0].naturalWidth", i) > 0 for i in imgs)
        eval_rows = driver.find_elements(By.CSS_SELECTOR, "#eval-table tr")
        assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in eval_rows[1:]] == ["1", "2"]
        assert len(driver.find_elements(By.CSS_SELECTOR, "#k3-by-turn tr")) == 3
        assert len(driver.find_elements(By.CSS_SELECTOR, "#alpha-by-turn tr")) == 3
        # the episode viewer: step 2's first episode, as the segment file has it
        seg = sorted(read_segments(run_dir, steps=[2]).to_pylist(), key=lambda r: (r["episode_id"], r["turn"]))
        ep = [r for r in seg if r["episode_id"] == seg[0]["episode_id"]]
        box = driver.find_element(By.CSS_SELECTOR, f"#step-2 ~ details.episode[data-episode='{ep[0]['episode_id']}']")
        assert not box.find_element(By.CLASS_NAME, "turn").is_displayed()           # closed until clicked
        box.find_element(By.TAG_NAME, "summary").click()
        turns = box.find_elements(By.CLASS_NAME, "turn")
        assert len(turns) == len(ep) and all(t.is_displayed() for t in turns)
        for t, r in zip(turns, ep):
            assert r["observation"].splitlines()[0] in t.find_element(By.CLASS_NAME, "obs").text
            toks = t.find_elements(By.CSS_SELECTOR, ".act .t")
            assert len(toks) == r["tokens"]
            # the tiny model's tokens hold control characters: shown as their escapes (\x11)
            assert "".join(x.get_attribute("textContent") for x in toks) == "".join(r["token_text"]).translate(
                VISIBLE_CONTROLS)
            assert f"log μ = {r['logp_behaviour'][0]:.4f}" in toks[0].get_attribute("title")
        # colour by α: the token's background becomes its turn's α colour
        driver.find_element(By.ID, "colour-alpha").click()
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("class") == "by-alpha"
        want = driver.execute_script(
            "const d=document.createElement('div');d.style.background=arguments[0];document.body.appendChild(d);"
            "const c=getComputedStyle(d).backgroundColor;d.remove();return c;", alpha_colour(ep[0]["alpha"]))
        first_tok = turns[0].find_element(By.CSS_SELECTOR, ".act .t")
        assert driver.execute_script("return getComputedStyle(arguments[0]).backgroundColor", first_tok) == want
    finally:
        driver.quit()
