"""`agentq report <run>`: one static HTML file (no server, no network) describing an RL run.

Sections: for an `agentq pipeline` folder the SFT → RL comparison (summary.json); the learning
curves (PNG, embedded) with the skipped steps and errored training episodes; the held-out
evaluations (eval/step_*/eval.json, and those `agentq eval` wrote into the run's checkpoints:
checkpoints/step_*/eval-<env>-<split>[-settings]),
K3 and InterQ-RL's α by turn over training (from metrics.jsonl and the segment history; a long
run's tables show `table_rows` steps spread over it, so the page does not grow with the run), and an
episode viewer over the segment history (`segments/step_*.parquet`): every turn's observation and
reply, each action token coloured by δ = log π_old − log μ, by the behaviour log-prob log μ or, for
InterQ-RL, by the turn's retention α (a switch at the top; log μ and δ are in each token's tooltip,
α with InterQ-RL's m and H in its turn's header, Σk3 there for objectives without α), with the
episode's reward and advantage. Every text from a run folder is escaped
(`escape`: control characters shown as escapes, \\x03).
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from omegaconf import OmegaConf

from agentq.config import env_label, quant_name, read_settings, run_folder_state
from agentq.utils.files import replaced
from agentq.utils.logging import console, counted, read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .episodes import EvalPairError, read_eval
from .metrics import NO_PAIRS, paired_test_name
from .segments import read_segments, segment_steps

T = TypeVar("T")

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1200px;color:#222}
h1{font-size:22px} h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left}
details.episode{border:1px solid #ccc;border-radius:6px;margin:6px 0;padding:4px 8px}
details.episode summary{cursor:pointer}
.turn{border-left:6px solid var(--alpha);margin:8px 0;padding:4px 8px;background:#fafafa}
.obs{white-space:pre-wrap;color:#555;font-size:12px;max-height:12em;overflow:auto}
.act{font-family:ui-monospace,monospace;margin-top:4px}
.t{white-space:pre;border-radius:2px}
body.by-alpha .t{background:var(--alpha)}
.meta{color:#666;font-size:12px}
.legend span{display:inline-block;padding:1px 6px;margin-right:4px}
"""

#: base colours: δ > 0 red, δ < 0 blue, behaviour log-prob orange (opacity = strength)
RED, BLUE, ORANGE = (220, 40, 40), (40, 90, 220), (230, 140, 0)
#: opacity steps of a token's colour in the viewer (a class per step: p/n = δ > 0 / < 0, l = log μ)
LEVELS = 10


def token_css() -> str:
    """The viewer's colour classes: `.p3` is δ > 0 at opacity 0.3 under "colour by δ", `.l7` log μ at
    0.7 under "colour by log μ"; under "colour by α" every token takes its turn's `--alpha`. A class
    per token instead of three inline colours and α in every tooltip: a long run's episodes were
    ~150 bytes of markup per token."""
    rules = []
    for i in range(1, LEVELS + 1):
        a = f"{i / LEVELS:g}"
        rules += [f"body.by-delta .p{i}{{background:{_rgba(RED, a)}}}", f"body.by-delta .n{i}{{background:{_rgba(BLUE, a)}}}",
                  f"body.by-logp .l{i}{{background:{_rgba(ORANGE, a)}}}"]
    return "\n".join(rules) + "\n"


def _rgba(rgb: tuple[int, int, int], a: str) -> str:
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{a})"


SWITCH_JS = """
function colourBy(mode){document.body.className='by-'+mode;}
"""


#: control characters (C0 but tab, newline and carriage return; DEL; C1: the set envs.base's
#: `action_problem` refuses), shown as their Python escape, e.g. \x03: html.escape passes them
#: through, and raw they are invalid HTML and invisible in a token of model or env text
VISIBLE_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(32), *range(127, 160)) if chr(c) not in "\t\n\r"}


def escape(text: str) -> str:
    """Text from a run folder for the page: HTML-escaped (quotes too), control characters made visible."""
    return html.escape(text, quote=True).translate(VISIBLE_CONTROLS)


def _png_data_uri(fig: Figure) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _fmt(v: object, digits: int = 3) -> str:
    """A number for the page ("–" for None or NaN), `digits` decimals; near 0, `digits` significant
    digits; near 1, as many decimals as it takes to tell it from 1 (α = 1 − 6e-12 read "1.000")."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        if abs(v) < 1e-3 and v != 0:
            return f"{v:.{digits}g}"
        while v != 1.0 and f"{v:.{digits}f}" == f"{1.0:.{digits}f}" and digits < 17:
            digits += 1
        return f"{v:.{digits}f}"
    return escape(str(v))


# ---------------------------------------------------------------------- colours
def delta_colour(delta: float, scale: float) -> str:
    """δ > 0 (π_old above μ) red, δ < 0 blue, opacity |δ| / scale (capped at 1)."""
    a = min(1.0, abs(delta) / scale) if scale > 0 else 0.0
    return _rgba(RED if delta > 0 else BLUE, f"{a:.3f}")


def logp_colour(logp: float) -> str:
    """log μ: likely tokens (log μ ≈ 0) pale, unlikely ones (log μ ≤ −5) deep orange."""
    return _rgba(ORANGE, f"{min(1.0, -logp / 5.0):.3f}")


def _level(x: float) -> int:
    """x in [0, 1] (clipped; NaN → 0) as one of the viewer's opacity steps 0..LEVELS."""
    return round(LEVELS * max(0.0, min(1.0, x))) if x == x else 0


def token_span(text: str, logp: float, delta: float, scale: float) -> str:
    """One action token of the viewer: its colour classes (`token_css`) and its numbers as tooltip."""
    cls = ["t"]
    d = _level(abs(delta) / scale) if scale > 0 else 0
    if d:
        cls.append(f"{'p' if delta > 0 else 'n'}{d}")
    lv = _level(-logp / 5.0)
    if lv:
        cls.append(f"l{lv}")
    attr = f"'{' '.join(cls)}'" if len(cls) > 1 else "t"
    tip = escape(f"log μ = {logp:.4f}  δ = {delta:.3g}")
    return f"<span class={attr} title='{tip}'>{escape(text)}</span>"


def alpha_colour(alpha: float | None) -> str:
    """α from red (0) through yellow to green (1); grey when the objective has no α."""
    if alpha is None or math.isnan(alpha):
        return "#bbb"
    return f"hsl({120 * max(0.0, min(1.0, alpha)):.0f},70%,45%)"


# ---------------------------------------------------------------------- sections
def curves_section(rows: list[dict], cfg: dict, summary: dict | None = None) -> str:
    """The learning curve and the mismatch plot; for a pipeline (`summary`), the SFT level on the
    curve, as in the pipeline's own learning_curve.png."""
    from .plots import learning_curve_figure, mismatch_figure

    parts = ["<h2 id='curves'>Learning curves</h2>"]
    if not any("reward_mean" in r for r in rows):
        return parts[0] + "<p>No training steps in metrics.jsonl.</p>"
    split = (cfg.get("env") or {}).get("eval_split")
    sft = (summary or {}).get("sft_success_rate")
    fig = learning_curve_figure(rows, sft_success=sft if isinstance(sft, (int, float)) else None, split=split,
                                sft_episodes=(summary or {}).get("episodes"))
    parts.append(f"<img alt='learning curve' src='{_png_data_uri(fig)}'>")
    parts.append(f"<img alt='mismatch' src='{_png_data_uri(mismatch_figure(rows))}'>")
    return "\n".join(parts + [training_losses(rows)])


#: skipped steps `training_losses` lists by number at most (a long run's line stays one line)
MAX_LISTED = 20


def training_losses(rows: list[dict]) -> str:
    """One line on the steps that made no update (`skipped_step`) and the training episodes that errored
    (`errored_episodes`: left out of their step's means, so the curves alone hid them); "" for neither."""
    train = [r for r in rows if "reward_mean" in r]
    skipped = [r["step"] for r in train if r.get("skipped_step")]
    errored = [r["errored_episodes"] for r in train if r.get("errored_episodes")]
    parts = []
    if skipped:
        listed = ", ".join(map(str, skipped[:MAX_LISTED])) + (", …" if len(skipped) > MAX_LISTED else "")
        parts.append(f"{counted(len(skipped), 'step')} skipped (no usable episode, no update): {listed}")
    if errored:
        parts.append(f"{counted(sum(errored), 'episode')} errored, in {counted(len(errored), 'step')} (left out of "
                     "the step means; each one's error is in errors.jsonl)")
    return f"<p class=meta id='training-losses'>Training: {'; '.join(parts)}.</p>" if parts else ""


def eval_section(run_dir: Path, top: Path | None = None) -> str:
    """The held-out evaluations: the trainer's (eval/step_*), then `agentq eval`'s of the run's
    checkpoints (`checkpoint_eval_folders`; `top`: the folder given, a pipeline's for its SFT checkpoint)."""
    reports, refused = read_evals(run_dir)
    others, refused_others = _read_pairs(checkpoint_eval_folders(run_dir, top or run_dir))
    out = ["<h2 id='evals'>Held-out evaluations</h2>"]
    out += [f"<p class=meta>left out: {escape(e)}</p>" for e in refused + refused_others]
    if not reports and not others:
        return "\n".join(out + ["<p>No evaluations in this run.</p>"])
    out.append(_trainer_evals(reports) if reports else "<p>None during training (eval/step_*).</p>")
    if others:
        out.append("<h3 id='checkpoint-evals'>Of the run's checkpoints, by <code>agentq eval</code></h3>"
                   "<table id='checkpoint-eval-table'><tr><th class=l>checkpoint</th><th class=l>folder</th>"
                   f"<th class=l>split</th><th class=l>rollout, decoding</th>{EVAL_HEAD}</tr>")
        out += [f"<tr><td class=l>{escape(label)}</td><td class=l>{escape(folder.name)}</td>"
                f"<td class=l>{_fmt(r.get('split'))}</td><td class=l>{escape(_decoding(r))}</td>{_eval_cells(r)}</tr>"
                for (label, folder), r in others]
        out.append("</table>")
    if any(_lost_counts(r) for r in reports + [r for _, r in others]):
        out.append(LOST_NOTE)
    return "\n".join(out)


#: below the evaluation tables when an episodes cell counts lost ones (`_episodes_cell`)
LOST_NOTE = ("<p class=meta id='eval-lost'>errored: the environment failed (each such episode's error is under "
             "\"error\" in its evaluation's episodes.jsonl); not played: the first prompt did not fit "
             "env.max_context_tokens. Both count as lost in the success rate.</p>")

#: the columns every evaluation table ends with (`_eval_cells`)
EVAL_HEAD = ("<th>episodes</th><th>success</th><th>95 % CI</th><th>score</th><th>turns (won)</th><th>step cap</th>"
             "<th class=l>tasks</th>")


def _eval_cells(r: dict) -> str:
    lo, hi = r.get("success_ci95") or [None, None]
    sel = (r.get("task_selection") or {}).get("description", "")
    return (f"<td>{_episodes_cell(r)}</td><td>{_fmt(r.get('success_rate'))}</td><td>{_fmt(lo)}–{_fmt(hi)}</td>"
            f"<td>{_fmt(r.get('score_mean'))}</td><td>{_fmt(r.get('turns_success_mean'), 2)}</td>"
            f"<td>{_fmt(r.get('cap_rate'))}</td><td class=l>{escape(sel)}</td>")


def _lost_counts(r: dict) -> list[str]:
    """An evaluation's episodes that errored or were not played, e.g. ["1 errored"]; [] for none (or an
    eval.json from before `unplayed` was recorded)."""
    counts = {"errored": int(r.get("errors") or 0), "not played": int(r.get("unplayed") or 0)}
    return [f"{n} {what}" for what, n in counts.items() if n]


def _episodes_cell(r: dict) -> str:
    """The episodes, with the lost ones said where there are any: "0.000 of 10" hid an env failure."""
    lost = _lost_counts(r)
    return _fmt(r.get("episodes")) + (f" ({', '.join(lost)})" if lost else "")


def _decoding(r: dict) -> str:
    """How an evaluation played, from its eval.json (the settings its folder's name ends with):
    "w8a8_kv8, greedy", "bf16 (vllm), T=1, ×2"; "–" for what an older eval.json did not record."""
    sampling = r.get("sampling") or {}
    t, repeats = sampling.get("temperature", r.get("temperature")), int(sampling.get("repeats") or 1)
    backend = r.get("rollout_backend")
    # named as the folder names it (rollout=bf16 is rollout_quant "none")
    parts = [(quant_name(str(r["rollout_quant"])) if "rollout_quant" in r else "–")
             + (f" ({backend})" if backend and backend != "torch" else ""),
             "–" if t is None else "greedy" if float(t) == 0 else f"T={float(t):g}"]
    return ", ".join(parts + ([f"×{repeats}"] if repeats > 1 else []))


def _trainer_evals(reports: list[dict]) -> str:
    """The trainer's evaluations (eval/step_*), and the last one's success per task type."""
    out = [f"<table id='eval-table'><tr><th>step</th><th class=l>split</th>{EVAL_HEAD}</tr>"]
    out += [f"<tr><td>{_fmt(r.get('step'))}</td><td class=l>{_fmt(r.get('split'))}</td>{_eval_cells(r)}</tr>"
            for r in reports]
    out.append("</table>")
    last = reports[-1]
    types = last.get("per_task_type") or {}
    if types:
        out.append(f"<p>Per task type at step {last.get('step')}:</p><table id='eval-types'>"
                   "<tr><th class=l>task type</th><th>episodes</th><th>success</th><th>score</th></tr>")
        for k, v in types.items():
            out.append(f"<tr><td class=l>{escape(k)}</td><td>{v['episodes']}</td>"
                       f"<td>{_fmt(v['success_rate'])}</td><td>{_fmt(v.get('score_mean'))}</td></tr>")
        out.append("</table>")
    return "\n".join(out)


def read_evals(run_dir: Path) -> tuple[list[dict], list[str]]:
    """(the run's evaluations, eval/step_*/eval.json in step order; the one-line error of each whose
    eval.json does not match its episodes.jsonl, `read_eval`), each error also printed: one such
    folder leaves its row out rather than the whole report."""
    pairs, refused = _read_pairs([(None, p.parent) for p in sorted((run_dir / "eval").glob("step_*/eval.json"))])
    return [r for _, r in pairs], refused


def checkpoint_eval_folders(run_dir: Path, top: Path) -> list[tuple[str, Path]]:
    """`agentq eval`'s output folders in the run's checkpoints (<checkpoint>/eval-<env>-<split>[-settings],
    or any folder with an eval.json there: eval.out_dir may name one), as (the checkpoint, e.g.
    "step 3", the folder), in step order; for a pipeline (`top` above `run_dir`), its SFT checkpoint's
    first. A checkpoint that trainer.keep_checkpoints removed keeps its folder with these in it."""
    found = [("SFT", p.parent) for p in sorted((top / "sft" / "checkpoint").glob("*/eval.json"))] if top != run_dir else []
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*")):
        step = ckpt.name.removeprefix("step_")
        found += [(f"step {int(step) if step.isdigit() else step}", p.parent) for p in sorted(ckpt.glob("*/eval.json"))]
    return found


def _read_pairs(folders: list[tuple[T, Path]]) -> tuple[list[tuple[tuple[T, Path], dict]], list[str]]:
    """Each (key, evaluation folder) with its eval.json (`read_eval`: checked against its episodes.jsonl),
    and the one-line error of each folder whose pair does not match, also printed."""
    pairs, refused = [], []
    for key, folder in folders:
        try:
            pairs.append(((key, folder), read_eval(folder)))
        except EvalPairError as e:
            refused.append(str(e))
            console.print(f"warning: {e}", style="yellow", markup=False, highlight=False, soft_wrap=True)
    return pairs, refused


def table_steps(rows: list[dict], seg_steps: list[int], k: int) -> list[int]:
    """The steps the by-turn tables show: every step with a k3_by_turn row or a segment file, or for
    a longer run k of them spread over it, the first and the last included (`viewer_steps`)."""
    return viewer_steps(sorted({int(r["step"]) for r in rows if "k3_by_turn" in r} | set(seg_steps)), k)


def by_turn_section(rows: list[dict], seg_by_step: dict[int, list[dict]], max_rows: int | None = None) -> str:
    """Steps × turns tables of K3 (metrics.jsonl's k3_by_turn) and of the median α per turn (segments);
    with `max_rows`, only the rows of `table_steps` (a long run's page stays the same size)."""
    train = [r for r in rows if "k3_by_turn" in r]
    out = ["<h2 id='by-turn'>K3 and α by turn over training</h2>"]
    if not train:
        return out[0] + "<p>No k3_by_turn in metrics.jsonl.</p>"
    all_steps = sorted({int(r["step"]) for r in train} | set(seg_by_step))
    if max_rows is not None and len(all_steps) > max_rows:
        keep = set(table_steps(rows, list(seg_by_step), max_rows))
        train = [r for r in train if r["step"] in keep]
        seg_by_step = {s: v for s, v in seg_by_step.items() if s in keep}
        out.append(f"<p class=meta>{len(keep)} of the run's {len(all_steps)} steps, spread over it (the first and "
                   "the last included); every step's numbers are in metrics.jsonl and segments/.</p>")
    n_turns = max(len(r["k3_by_turn"] or []) for r in train)
    k3_max = max([v for r in train for v in (r["k3_by_turn"] or []) if v is not None and not math.isnan(v)] or [0.0])
    head = "".join(f"<th>{s}</th>" for s in range(1, n_turns + 1))
    out.append(f"<p>K3 per action token of turn s (colour: share of the largest, {_fmt(k3_max)}).</p>"
               f"<table id='k3-by-turn'><tr><th>step</th>{head}</tr>")
    for r in train:
        cells = []
        for v in (r["k3_by_turn"] or []) + [None] * (n_turns - len(r["k3_by_turn"] or [])):
            bg = delta_colour(v, k3_max) if v and k3_max > 0 else "none"
            cells.append(f"<td style='background:{bg}'>{_fmt(v)}</td>")
        out.append(f"<tr><td>{r['step']}</td>{''.join(cells)}</tr>")
    out.append("</table>")
    if any(s["alpha"] is not None for rs in seg_by_step.values() for s in rs):
        out.append(f"<p>Median retention α of turn s over the step's trajectories.</p>"
                   f"<table id='alpha-by-turn'><tr><th>step</th>{head}</tr>")
        for step, rs in sorted(seg_by_step.items()):
            cells = []
            for s in range(1, n_turns + 1):
                vals = sorted(x["alpha"] for x in rs if x["turn"] == s and x["tokens"] > 0 and x["alpha"] is not None)
                med = statistics.median(vals) if vals else None     # of two middles, their mean
                cells.append(f"<td style='background:{alpha_colour(med) if med is not None else 'none'}'>{_fmt(med)}</td>")
            out.append(f"<tr><td>{step}</td>{''.join(cells)}</tr>")
        out.append("</table>")
    return "\n".join(out)


def turn_head(seg: dict, interq: bool) -> str:
    """A turn's header line in the viewer: InterQ-RL's m, H and α for a run that computed α
    (`interq`); for other objectives, which never used m and H, Σk3 instead."""
    head = f"turn {seg['turn']} · {seg['tokens']} tokens · Σδ {_fmt(seg['delta_sum'])} · "
    if interq:
        return head + f"m {_fmt(seg['m'])} · H {_fmt(seg['H'])} · α {_fmt(seg['alpha'])}"
    return head + f"Σk3 {_fmt(seg['k3_sum'])}"


def episode_html(ep: list[dict], delta_scale: float, interq: bool = True) -> str:
    """One trajectory (its segment rows, turn order) as a <details> block; `interq`: the run has α
    (the turn's bar and header show it)."""
    first = ep[0]
    outcome = "won" if first["won"] else first.get("end_reason") or "lost"
    head = (f"episode {first['episode_id']} · task {escape(str(first['task_id']))} · {escape(outcome)} · "
            f"reward {_fmt(first['reward'])} · advantage {_fmt(first['advantage'])} · {counted(len(ep), 'turn')}")
    turns = []
    for seg in ep:
        toks = []
        texts = seg.get("token_text") or [str(i) for i in seg["token_ids"]]
        for text, lp, d in zip(texts, seg["logp_behaviour"], seg["delta"]):
            toks.append(token_span(text, lp, d, delta_scale))
        bar = f" style='--alpha:{alpha_colour(seg['alpha'])}'" if interq else ""
        turns.append(
            f"<div class=turn{bar} data-turn='{seg['turn']}'><div class=meta>{turn_head(seg, interq)}</div>"
            f"<div class=obs>{escape(seg.get('observation') or '')}</div>"
            f"<div class=act>{''.join(toks)}</div>"
            f"<div class=meta>{_action_text(seg.get('action'))} → "
            f"{escape((seg.get('feedback') or '')[:300])}</div></div>")
    return (f"<details class=episode data-episode='{first['episode_id']}'><summary>{head}</summary>"
            f"{''.join(turns)}</details>")


def _action_text(action: str | None) -> str:
    """A turn's parsed action for the viewer; a reply without one read "action: None"."""
    return "no parsable action" if action is None else f"action: {escape(action)}"


def colour_switch(scale: float, interq: bool) -> str:
    """The viewer's colour choice: δ (full colour at |δ| = `scale`), log μ, and for a run with α
    (`interq`) α; other objectives have none to colour by (every token was grey)."""
    alpha = ("<label><input type=radio name=colour id=colour-alpha onclick=\"colourBy('alpha')\"> retention α "
             "(green 1 → red 0)</label>") if interq else ""
    return ("<p>Colour action tokens by: "
            "<label><input type=radio name=colour id=colour-delta onclick=\"colourBy('delta')\" checked> δ = log π_old − log μ "
            f"(red +, blue −; full colour at |δ| = {_fmt(scale)}, the 99th percentile)</label> "
            "<label><input type=radio name=colour id=colour-logp onclick=\"colourBy('logp')\"> behaviour log μ "
            f"(deep at ≤ −5)</label> {alpha}. Hover a token for its numbers"
            + ("; the bar left of a turn is its α.</p>" if interq else ".</p>"))


def unlogged_note(unlogged: list[int]) -> str:
    """A line naming the segment files of steps without a metrics.jsonl row (a run stopped between
    writing a step's segments and its row): the viewer leaves them out; "" when there are none."""
    if not unlogged:
        return ""
    files = ", ".join(f"segments/step_{s:06d}.parquet" for s in unlogged)
    return ("<p class=meta>Not shown, as metrics.jsonl has no row of the step (the run stopped after writing "
            f"the segment file, before logging the step; a resume redoes it): {escape(files)}.</p>")


def logged_segment_steps(run_dir: Path, rows: list[dict]) -> tuple[list[int], list[int]]:
    """The steps with a segment file that metrics.jsonl has a row of, and those it has none of."""
    logged = {int(r["step"]) for r in rows}
    files = segment_steps(run_dir)
    return [s for s in files if s in logged], [s for s in files if s not in logged]


def viewer_section(seg_by_step: dict[int, list[dict]], max_episodes: int, unlogged: list[int] | None = None) -> str:
    """The episode viewer of the steps `seg_by_step` holds (their whole segment rows), `max_episodes`
    trajectories a step; α (switch, bars, InterQ-RL's turn numbers) only where some row has one.
    `unlogged`: steps with a segment file but no metrics.jsonl row, left out and named."""
    out = ["<h2 id='episodes'>Episode viewer</h2>", unlogged_note(unlogged or [])]
    if not seg_by_step:
        return "".join(out) + ("<p>No segment history (segments/step_*.parquet) in this run.</p>" if not unlogged
                               else "<p>No logged step has a segment history.</p>")
    deltas = sorted(abs(d) for rs in seg_by_step.values() for s in rs for d in s["delta"])
    scale = deltas[int(0.99 * (len(deltas) - 1))] if deltas else 0.0
    scale = scale if scale > 0 else (deltas[-1] if deltas else 0.0)
    interq = any(s["alpha"] is not None for rs in seg_by_step.values() for s in rs)
    out.append(colour_switch(scale, interq))
    for step, rs in sorted(seg_by_step.items()):
        eps: dict[int, list[dict]] = {}
        for s in rs:
            eps.setdefault(s["episode_id"], []).append(s)
        out.append(f"<h3 id='step-{step}'>Step {step} ({counted(len(eps), 'trajectory', 'trajectories')}"
                   f"{', first ' + str(max_episodes) + ' shown' if len(eps) > max_episodes else ''})</h3>")
        for eid in sorted(eps)[:max_episodes]:
            out.append(episode_html(sorted(eps[eid], key=lambda s: s["turn"]), scale, interq))
    return "\n".join(out)


def viewer_steps(steps: list[int], k: int) -> list[int]:
    """Up to k steps spread over the run, always the first and the last (k = 1: the last)."""
    if len(steps) <= k:
        return steps
    if k <= 1:
        return steps[-1:] if k == 1 else []
    return sorted({steps[round(i * (len(steps) - 1) / (k - 1))] for i in range(k)})


def rl_run_dir(folder: Path) -> tuple[Path, dict | None]:
    """The RL run folder of `folder` and, for an `agentq pipeline` folder (whose RL run is rl/, the
    folder the pipeline prints), its summary.json: `agentq report runs/pipeline-*` works as is.

    Raises:
        FileNotFoundError: neither `folder` nor `folder`/rl holds a metrics.jsonl, or `folder` is an
            `agentq sft` folder (its metrics.jsonl has no RL step: its report read "interq · 0 steps").
    """
    if (folder / "sft_summary.json").exists() or (folder / "demos.jsonl").exists():
        pipeline = folder.parent if (folder.parent / "rl" / "metrics.jsonl").exists() else None
        raise FileNotFoundError(f"{folder} is an `agentq sft` folder, not an RL run: agentq report renders an `agentq "
                                "train` or `agentq pipeline` folder" + (f" (its pipeline's: agentq report {pipeline})"
                                                                      if pipeline else "")
                                + f"; evaluate the SFT checkpoint with agentq eval checkpoint={folder / 'checkpoint'}")
    if (folder / "metrics.jsonl").exists():
        return folder, None
    if (folder / "rl" / "metrics.jsonl").exists():
        summary = folder / "summary.json"
        return folder / "rl", json.loads(summary.read_text()) if summary.exists() else None
    inside = _enclosing_run(folder)
    if not folder.exists():                 # a typo: not "a folder in the run", nor "not a run folder"
        raise FileNotFoundError(f"{folder}: no such folder" + (f" (in the run folder {inside}: agentq report "
                                                                f"{inside})" if inside else ""))
    if inside:      # a folder the user found in a run (an evaluation's, a checkpoint): its run, in one line
        raise FileNotFoundError(f"{folder} is {_what_folder(folder.resolve())} in the run folder {inside}, not a run "
                                f"folder itself: agentq report {inside}")
    raise FileNotFoundError(_no_results_yet(folder) or _sweep_folder(folder)
                            or f"{folder} is not an agentq run folder (no metrics.jsonl, nor rl/metrics.jsonl of an "
                            "`agentq pipeline` folder)")


#: what only `agentq sweep` writes at the top of its folder (trainer.run_dir.MARKERS): a folder of runs
#: (arms/<arm>/seed_<n>), with an sft/ of its own, never a run to report itself
SWEEP_MARKERS = ("arms", "eval_sft", "table.md")


def _sweep_folder(folder: Path) -> str | None:
    """For `rl_run_dir`'s message: an `agentq sweep` folder (`SWEEP_MARKERS`) said so (it read "not an
    agentq run folder"), with its table and how to report one of its arm × seed runs.

    Returns:
        The message, or None for a folder that is not a sweep's.
    """
    if not any((folder / name).exists() for name in SWEEP_MARKERS):
        return None
    runs = sorted(m.parent for m in folder.glob("arms/*/seed_*/metrics.jsonl"))
    table = folder / "table.md"
    said = (f"its table is {table}" if table.is_file() else
            f"it has no table.md yet (agentq sweep sweep.table_only=true sweep.out_dir={folder} writes the table of "
            "its finished runs)")
    return (f"{folder} is an `agentq sweep` folder, not a run: {said}; report one of its runs with agentq report "
            f"{folder}/arms/<arm>/seed_<n>" + (f" (e.g. agentq report {runs[0]})" if runs else ""))


def _no_results_yet(folder: Path) -> str | None:
    """For `rl_run_dir`'s message: a run folder whose run has logged no RL step yet, said so (it read
    "not an agentq run folder"): one in progress (another agentq process holds its lock) or one whose
    run stopped before (its config.yaml); None for any other folder, a sweep's among them."""
    if any((folder / name).exists() for name in SWEEP_MARKERS):
        return None
    found = run_folder_state(folder)
    if found is None:
        return None
    kind, what = found
    if kind == "held":
        return (f"{folder} is held by agentq process pid {what} and has no metrics.jsonl yet: a run in progress is "
                "reported once its first RL step is logged")
    return (f"{folder} is a run folder with no results yet: its run stopped before logging its first RL step "
            f"({what}, no metrics.jsonl)")


def _renders(folder: Path) -> bool:
    """Whether `agentq report` renders `folder`: an RL run or a pipeline (not an `agentq sft` folder)."""
    sft = (folder / "sft_summary.json").exists() or (folder / "demos.jsonl").exists()
    return not sft and ((folder / "metrics.jsonl").is_file() or (folder / "rl" / "metrics.jsonl").is_file())


def _enclosing_run(folder: Path) -> Path | None:
    """The run folder `folder` is inside, up to <run>/checkpoints/step_N/eval-<env>-<split> (a pipeline's,
    not its rl/, for a folder in its RL run: its report has the SFT → RL summary); None if none."""
    # absolute: `agentq report .` in a checkpoint has no parents to walk; named back as it was given
    run = next((up for up in list(folder.absolute().parents)[:3] if _renders(up)), None)
    if run is not None and run.name == "rl" and (run.parent / "summary.json").exists() and _renders(run.parent):
        run = run.parent
    return run if run is None or folder.is_absolute() else Path(os.path.relpath(run))


def _what_folder(folder: Path) -> str:
    """What a folder inside a run is, for `rl_run_dir`'s message."""
    if (folder / "eval.json").is_file():
        return "an evaluation's output folder (eval.json)"
    if (folder / "config.json").is_file() or folder.parent.name == "checkpoints":
        return "a checkpoint"
    return "the checkpoints folder" if folder.name == "checkpoints" else "a folder"


def _paired_cells(pr: dict) -> str:
    """A split's tasks better after RL / after SFT and its paired p; with no shared task there was no
    test (a summary.json from before NO_PAIRS recorded McNemar's p = 1 for it)."""
    if pr and paired_test_name(pr) == NO_PAIRS:
        return "<td>–</td><td>no shared tasks</td>"
    return (f"<td>{pr.get('won_only_after', '–')} / {pr.get('won_only_before', '–')}</td>"
            f"<td>{_fmt(pr.get('mcnemar_p'))}</td>")


def pipeline_section(summary: dict) -> str:
    """An `agentq pipeline` folder's summary.json: success after SFT and after RL per held-out split."""
    out = ["<h2 id='pipeline'>SFT → RL on held-out tasks (summary.json)</h2>",
           "<table id='pipeline-table'><tr><th class=l>split</th><th>episodes</th><th>after SFT</th><th>95 % CI</th>"
           "<th>after RL</th><th>95 % CI</th><th>tasks better after RL / after SFT</th><th>paired p</th></tr>"]
    tests: set[str] = set()           # which paired test gave each split's p
    for split, c in {summary["split"]: summary, **(summary.get("other_splits") or {})}.items():
        (s_lo, s_hi), (r_lo, r_hi) = c["sft_success_ci95"], c["rl_success_ci95"]
        pr = c.get("paired") or {}
        if pr and paired_test_name(pr) != NO_PAIRS:
            tests.add(paired_test_name(pr))
        out.append(f"<tr><td class=l>{escape(str(split))}</td><td>{c['episodes']}</td>"
                   f"<td>{_fmt(c['sft_success_rate'])}</td><td>{_fmt(s_lo)}–{_fmt(s_hi)}</td>"
                   f"<td>{_fmt(c['rl_success_rate'])}</td><td>{_fmt(r_lo)}–{_fmt(r_hi)}</td>{_paired_cells(pr)}</tr>")
    # a summary.json from before rollout_backend was recorded names the quantization alone
    rollout = quant_name(str(summary.get("rollout_quant"))) + (f" ({summary['rollout_backend']})"
                                                                if summary.get("rollout_backend") else "")
    out.append(f"</table><p class=meta>{counted(summary.get('sft_demos'), 'expert demonstration')}, "
               f"{counted(summary.get('rl_steps'), 'RL step')} ({escape(str(summary.get('algo')))}, rollout "
               f"{escape(rollout)}). Paired p "
               f"(two-sided, over tasks): {escape(', '.join(sorted(tests)) or '–')}.</p>")
    return "\n".join(out)


def run_settings(path: Path) -> dict:
    """The run's config.yaml as a dict for the page's labels; {} (and one warning) where it is missing
    or damaged: the page renders without the settings it names."""
    if not path.exists():
        return {}
    saved, why = read_settings(path)
    if saved is None:
        console.print(f"warning: {path} is damaged ({why}): the report leaves out the settings it would name",
                      style="yellow", markup=False, highlight=False, soft_wrap=True)
        return {}
    data = OmegaConf.to_container(saved, resolve=False)
    return data if isinstance(data, dict) else {}


def write_report(run_dir: str | Path, out: str | Path | None = None, viewer_steps_k: int = 4,
                 max_episodes: int = 16, table_rows: int = 60) -> Path:
    """Render `<run>/report.html` (or `out`).

    Args:
        run_dir: an RL run folder (config.yaml, metrics.jsonl, optionally eval/ and segments/), or an
            `agentq pipeline` folder (its rl/ run, with the SFT → RL summary on top).
        out: the HTML file to write (default <run>/report.html).
        viewer_steps_k: steps the episode viewer shows (spread over the run, first and last included).
        max_episodes: trajectories shown per step.
        table_rows: steps the K3 / α by-turn tables show at most (spread over the run).
    Returns:
        The path of the HTML file.
    """
    top = Path(run_dir)
    run_dir, summary = rl_run_dir(top)
    cfg = run_settings(run_dir / "config.yaml")
    rows = read_metrics(run_dir / "metrics.jsonl")
    all_steps, unlogged = logged_segment_steps(run_dir, rows)     # a killed run's last segment file: no row
    seg_by_step: dict[int, list[dict]] = {}
    in_tables = sorted(set(table_steps(rows, all_steps, table_rows)) & set(all_steps))
    if in_tables:          # only the steps the α table shows: a long run's history is not read whole
        alpha_cols = ["step", "turn", "tokens", "alpha"]
        for r in read_segments(run_dir, steps=in_tables, columns=alpha_cols).to_pylist():
            seg_by_step.setdefault(r["step"], []).append(r)
    shown = {s: read_segments(run_dir, steps=[s]).to_pylist() for s in viewer_steps(all_steps, viewer_steps_k)}
    algo = (cfg.get("algo") or {}).get("name", "?")
    steps = max((r["step"] for r in rows if "reward_mean" in r), default=0)
    title = f"agentq run {top.resolve().name}: {env_label(cfg.get('env'))} · {algo} · {counted(steps, 'step')}"
    body = "\n".join([
        f"<h1 id='title'>{escape(title)}</h1>",
        "<p>" + ("<a href='#pipeline'>SFT → RL</a> · " if summary else "")
        + "<a href='#curves'>curves</a> · <a href='#evals'>evaluations</a> · <a href='#by-turn'>by turn</a> · "
        "<a href='#episodes'>episodes</a></p>",
        pipeline_section(summary) if summary else "",
        curves_section(rows, cfg, summary), eval_section(run_dir, top), by_turn_section(rows, seg_by_step, table_rows),
        viewer_section(shown, max_episodes, unlogged)])
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{CSS}{token_css()}</style><script>{SWITCH_JS}</script></head><body class='by-delta'>{body}</body></html>")
    out = Path(out) if out else top / "report.html"
    with replaced(out) as tmp:              # a full disk mid-write keeps the last whole report
        tmp.write_text(page, encoding="utf-8")
    return out
