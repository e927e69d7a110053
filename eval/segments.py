"""The segment history: every action segment (turn) of every trajectory the learner trained on.

One row per (step, trajectory, turn), written by the RL trainer after `Objective.prepare`, to
`<run>/segments/step_<N>.parquet` (one Parquet file per step: a crash or a resume never leaves a
half-written file behind, and `read_segments(run)` reads the folder as one table). Columns:

    step, row (trajectory's row in the step's batch), episode_id, task_id, group_id, turn (s ≥ 1),
    tokens             action tokens in the segment
    delta_sum          Σ δ_t, δ_t = clamp(log π_old − log μ, ±20)
    k3_sum             Σ (e^δ − 1 − δ)                     (the `k3` metric, unclamped)
    m, H               InterQ-RL's segment mass (k3 clamped at k3_max) and execution prefix
    alpha, d           InterQ-RL's retention α_s and displacement (null for other objectives)
    reward, advantage, won, task_type, end_reason          the trajectory's
    observation        what the policy read before this turn (the first prompt, or the last feedback)
    assistant, action, feedback                            its reply, the parsed action, the env's answer
    token_ids, token_text, logp_behaviour, logp_old, delta   per action token (lists)
    position           per action token: its index in its batch row (one row per trajectory: its
                       position in the episode's context; step-independent layout: in the turn's row)
    logp_ref           per action token: log π_ref (null without a reference model)
    weight             per action token: the detached w_t of `Objective.prepare` (1 where it sets none),
                       the loss's weight but under InterQ-RL's renorm_retention, which divides it by
                       its minibatch's token-mean α

Files written before `position`, `logp_ref` and `weight` existed read with those columns null.

`step_metrics(table)` derives `k3`, `k3_by_turn` and the α diagnostics from these rows alone.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from agentq.agent.trajectory import Trajectory
from agentq.algos import interq_retention, k3, quantile, token_delta
from agentq.algos.interq import Retention, segment_sums, trajectory_rows
from agentq.learner.batch import PolicyBatch

if TYPE_CHECKING:        # pyarrow loads when segments are written or read
    import pyarrow as pa

FOLDER = "segments"


def _turn_texts(traj: Trajectory) -> list[dict]:
    """Per assistant turn: the observation before it, the reply, the parsed action and the feedback."""
    turns, seen = [], ""
    for entry in traj.transcript:
        if "assistant" not in entry:
            seen = entry.get("user", seen)
            continue
        turns.append({"observation": seen, "assistant": entry.get("assistant", ""), "action": entry.get("action"),
                      "feedback": entry.get("obs")})
        seen = entry.get("obs") or ""
    return turns


@torch.no_grad()
def segment_rows(step: int, trajs: list[Trajectory], batch: PolicyBatch, retention: Retention | None,
                 decode: Callable[[list[int]], list[str]] | None = None) -> list[dict]:
    """The step's segment rows from the collated batch (row i = trajs[i]) after `prepare`.

    Args:
        step: RL step number.
        trajs: the trajectories of the batch, in row order.
        batch: the PolicyBatch with old_logp filled, weighted (`PolicyBatch.weighted`) when the
            objective's weights are to be stored.
        retention: what InterQ-RL's prepare computed (None for other objectives: m and H are then
            computed with InterQ-RL's defaults, α left null).
        decode: token ids → one string per token (for the episode viewer); None stores no text.
    Returns:
        One dict per (trajectory, turn), columns as in the module docstring.
    """
    if batch.old_logp is None:
        raise ValueError("segment_rows needs batch.old_logp: call Learner.fill_old_and_ref first")
    old_logp = batch.old_logp
    mask = batch.action_mask.bool()
    seg = batch.seg_id.long()
    delta = token_delta(batch)                                           # [B, L] f64
    k3_t = k3(delta)
    traj_row, T = trajectory_rows(batch)
    r = retention if retention is not None else interq_retention(batch)
    S = r.m.shape[1]
    sums = {name: segment_sums(v, seg, mask, traj_row, T, S) for name, v in (("delta_sum", delta), ("k3_sum", k3_t))}
    rows = []
    for i, traj in enumerate(trajs):
        texts = _turn_texts(traj)
        ids, sel_mask, sel_seg = batch.input_ids[i], mask[i], seg[i]
        for s in range(1, int(r.num_segments[i]) + 1):
            on = sel_mask & (sel_seg == s)
            tok = ids[on].tolist()
            t = texts[s - 1] if s - 1 < len(texts) else {}
            rows.append({
                "step": step, "row": i, "episode_id": traj.episode_id, "task_id": traj.task_id,
                "group_id": traj.group_id, "turn": s, "tokens": int(r.n[i, s - 1]),
                "delta_sum": float(sums["delta_sum"][i, s - 1]), "k3_sum": float(sums["k3_sum"][i, s - 1]),
                "m": float(r.m[i, s - 1]), "H": float(r.H[i, s - 1]),
                "alpha": float(r.alpha[i, s - 1]) if retention is not None else None,
                "d": float(r.d[i, s - 1]) if retention is not None else None,
                "reward": float(traj.reward), "advantage": float(batch.adv[i]), "won": bool(traj.won),
                "task_type": traj.info.get("task_type"), "end_reason": traj.end_reason,
                "observation": t.get("observation"), "assistant": t.get("assistant"), "action": t.get("action"),
                "feedback": t.get("feedback"),
                "token_ids": tok, "token_text": decode(tok) if decode else None,
                **_token_columns(batch, i, on, old_logp, delta),
            })
    return rows


def _token_columns(batch: PolicyBatch, i: int, on: torch.Tensor, old_logp: torch.Tensor,
                   delta: torch.Tensor) -> dict[str, list | None]:
    """The per-token lists of row i's tokens `on` ([L] bool: one turn's action tokens).

    Args:
        batch: the weighted batch (`segment_rows`'s).
        i: the row.
        on: the turn's action tokens in that row.
        old_logp: [B, L] log π_old of the batch (filled).
        delta: [B, L] δ of the batch.
    Returns:
        logp_behaviour, logp_old, delta, position, logp_ref (None without π_ref) and weight.
    """
    n = int(on.sum())
    # the loss reads None as 1 on every action token (GRPO.token_weights)
    weight = batch.token_weight[i][on].tolist() if batch.token_weight is not None else [1.0] * n
    return {"logp_behaviour": batch.rollout_logp[i][on].tolist(), "logp_old": old_logp[i][on].tolist(),
            "delta": delta[i][on].tolist(), "position": torch.nonzero(on).flatten().tolist(),
            "logp_ref": batch.ref_logp[i][on].tolist() if batch.ref_logp is not None else None, "weight": weight}


def token_decoder(tokenizer: Any) -> Callable[[list[int]], list[str]]:
    """Token ids → the text of each token on its own (what the episode viewer colours)."""
    return lambda ids: tokenizer.batch_decode([[i] for i in ids])


def segments_due(save_segments: bool | int, step: int) -> bool:
    """Whether RL step `step` (1-based) writes its segment file under `trainer.save_segments`: every step
    for true, none for false, steps 1, N, 2N, ... for an integer N."""
    if isinstance(save_segments, bool):
        return save_segments
    return step == 1 or step % int(save_segments) == 0


def write_segments(run_dir: str | Path, step: int, rows: list[dict]) -> Path:
    """`<run>/segments/step_<N>.parquet`, written to a temporary name and renamed (atomic)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(run_dir) / FOLDER / f"step_{step:06d}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), tmp)
    tmp.replace(out)
    return out


def _schema():
    import pyarrow as pa

    f64, i64, s = pa.float64(), pa.int64(), pa.string()
    return pa.schema([
        ("step", i64), ("row", i64), ("episode_id", i64), ("task_id", s), ("group_id", i64), ("turn", i64),
        ("tokens", i64), ("delta_sum", f64), ("k3_sum", f64), ("m", f64), ("H", f64), ("alpha", f64), ("d", f64),
        ("reward", f64), ("advantage", f64), ("won", pa.bool_()), ("task_type", s), ("end_reason", s),
        ("observation", s), ("assistant", s), ("action", s), ("feedback", s),
        ("token_ids", pa.list_(i64)), ("token_text", pa.list_(s)), ("logp_behaviour", pa.list_(pa.float32())),
        ("logp_old", pa.list_(pa.float32())), ("delta", pa.list_(f64)),
        ("position", pa.list_(i64)), ("logp_ref", pa.list_(pa.float32())), ("weight", pa.list_(pa.float32())),
    ])


def segment_steps(run_dir: str | Path) -> list[int]:
    """Steps that have a segment file, ascending."""
    return sorted(int(p.stem.split("_")[1]) for p in (Path(run_dir) / FOLDER).glob("step_*.parquet"))


def read_segments(run_dir: str | Path, steps: list[int] | None = None,
                  columns: list[str] | None = None) -> pa.Table:
    """The segment history of a run as one pyarrow Table (`steps`: only those; `columns`: only those).
    `.to_pylist()` gives dicts; `.to_pandas()` a DataFrame when pandas is installed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(run_dir) / FOLDER
    steps = segment_steps(run_dir) if steps is None else steps
    if not steps:
        raise FileNotFoundError(f"{folder} has no step_*.parquet (was the run trained with trainer.save_segments?)")
    return pa.concat_tables([_read_step(folder / f"step_{s:06d}.parquet", columns) for s in steps])


def _read_step(path: Path, columns: list[str] | None) -> pa.Table:
    """One step file as today's schema: the columns an older file lacks (`_schema`'s later ones) null.

    Args:
        path: the step's Parquet file.
        columns: only those (None: all of `_schema`, then any other the file has).
    Returns:
        The table, its columns in the order asked (or `_schema`'s).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    has = set(pq.read_schema(path).names)
    wanted = columns if columns is not None else schema.names + sorted(has - set(schema.names))
    # a name neither in the file nor in the schema goes to pyarrow, whose error names it
    table = pq.read_table(path, columns=[c for c in wanted if c in has or c not in schema.names])
    for c in wanted:
        if c not in has and c in schema.names:
            table = table.append_column(schema.field(c), pa.nulls(table.num_rows, schema.field(c).type))
    return table.select(wanted)


def truncate_segments(run_dir: str | Path, last_step: int) -> None:
    """Drop the segment files of steps after `last_step` (a resumed run redoes those steps)."""
    for s in segment_steps(run_dir):
        if s > last_step:
            (Path(run_dir) / FOLDER / f"step_{s:06d}.parquet").unlink()


def step_metrics(rows: list[dict]) -> dict:
    """`k3`, `k3_by_turn` and the α diagnostics of one step, from its segment rows alone (the same
    definitions as `mismatch_metrics` and `retention_stats`: k3 over action tokens, α over segments
    with ≥ 1 action token)."""
    n_tok = sum(r["tokens"] for r in rows)
    turns = max((r["turn"] for r in rows), default=0)
    by_turn = []
    for s in range(1, turns + 1):
        sel = [r for r in rows if r["turn"] == s]
        n = sum(r["tokens"] for r in sel)
        by_turn.append(sum(r["k3_sum"] for r in sel) / n if n else math.nan)
    out = {"k3": sum(r["k3_sum"] for r in rows) / n_tok if n_tok else math.nan, "k3_by_turn": by_turn}
    alphas = [r["alpha"] for r in rows if r["tokens"] > 0 and r["alpha"] is not None]
    if alphas:
        a = torch.tensor(alphas, dtype=torch.float64)
        out.update(alpha_min=min(alphas), alpha_p10=quantile(a, 0.10), alpha_median=quantile(a, 0.5),
                   alpha_max=max(alphas),
                   alpha_token_mean=sum(r["alpha"] * r["tokens"] for r in rows if r["alpha"] is not None) / n_tok)
    return out
