"""Sessions as trajectories: every turn of an agent session in one training sequence, from the
recorded token ids, with the loss on the model's own tokens only.

An agent resends the whole conversation each turn, so turn k+1's served prompt normally starts with
turn k's prompt followed by turn k's completion (as the chat template re-renders it), then the tool
results and user turns that came in between. A trajectory is built by walking the turns in order:

    ids    = prompt_1 + completion_1 + (prompt_2 - what came before) + completion_2 + ...
    labels = masked   + completion_1 + masked                        + completion_2 + ...

so user turns, tool results and template tokens are context, and every assistant turn is trained on
exactly the tokens it was sampled as. When a turn's served prompt does not continue the sequence so
far (the template re-tokenized a reply differently, the client edited the history, the session
forked), the sequence is closed and a new one starts from that turn's own prompt: each completion
is always trained in the exact context it was served in, never a re-tokenization of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from reef.experience.load import SESSION_COL
from reef.recipe.tokens import IGNORE


@dataclass
class Trajectory:
    session_id: str
    record_ids: list[str] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return len(self.record_ids)


def _continues(ids: Sequence[int], prompt: Sequence[int]) -> bool:
    return len(prompt) >= len(ids) and list(prompt[: len(ids)]) == list(ids)


def _choice_ids(choices: Sequence[dict[str, Any]], next_prompt: Sequence[int] | None,
                prefix: Sequence[int]) -> list[int]:
    """The completion the session went on with: the choice the next turn's prompt continues (n > 1
    samples a turn several ways), else the first one with token ids."""
    sampled = [list(c["token_ids"]) for c in choices if c["token_ids"]]
    if next_prompt is not None:
        for ids in sampled:
            if _continues([*prefix, *ids[:-1]], next_prompt):  # its end token may be re-rendered
                return ids
    return sampled[0] if sampled else []


def session_trajectories(session_id: str, turns: Sequence[dict[str, Any]]) -> list[Trajectory]:
    """Trajectories of one session; `turns` are its records (dicts with `record_id`,
    `prompt_token_ids`, `choices`), oldest first. One trajectory unless the prompts break off."""
    out: list[Trajectory] = []
    current: Trajectory | None = None
    for k, turn in enumerate(turns):
        prompt = list(turn["prompt_token_ids"])
        if not prompt:
            continue
        if current is None or not _continues(current.input_ids, prompt):
            current = Trajectory(session_id)
            out.append(current)
        context = prompt[len(current.input_ids):]
        next_prompt = turns[k + 1]["prompt_token_ids"] if k + 1 < len(turns) else None
        completion = _choice_ids(turn["choices"], next_prompt, prompt)
        if not completion:
            continue
        current.record_ids.append(turn["record_id"])
        current.input_ids += context + completion
        current.labels += [IGNORE] * len(context) + completion
    return [t for t in out if t.record_ids]


def trajectories(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per trajectory of the sessions in a snapshot frame: session_id, record_ids, turns,
    input_ids, labels (the model's own tokens; everything else masked), and the session's score
    (its last turn's), weight (the lowest of its turns) and group (its first turn's)."""
    columns = [SESSION_COL, "record_id", "created_at", "prompt_token_ids", "choices"]
    extra = [c for c in ("score", "weight", "group") if c in frame.columns]
    rows = frame.select(*columns, *extra).sort(SESSION_COL, "created_at", "record_id").to_dicts()
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_session.setdefault(row[SESSION_COL], []).append(row)
    out: dict[str, list[Any]] = {k: [] for k in ("session_id", "record_ids", "turns", "input_ids", "labels", *extra)}
    for session_id, turns in by_session.items():
        by_id = {t["record_id"]: t for t in turns}
        for traj in session_trajectories(session_id, turns):
            members = [by_id[r] for r in traj.record_ids]
            out["session_id"].append(session_id)
            out["record_ids"].append(traj.record_ids)
            out["turns"].append(traj.turns)
            out["input_ids"].append(traj.input_ids)
            out["labels"].append(traj.labels)
            if "score" in extra:
                out["score"].append(members[-1]["score"])
            if "weight" in extra:
                out["weight"].append(min(m["weight"] for m in members))
            if "group" in extra:
                out["group"].append(members[0]["group"])
    schema: dict[str, pl.DataType | type[pl.DataType]] = {
        "session_id": pl.String, "record_ids": pl.List(pl.String), "turns": pl.Int64,
        "input_ids": pl.List(pl.Int64), "labels": pl.List(pl.Int64),
        "score": pl.Float64, "weight": pl.Float64, "group": pl.String}
    return pl.DataFrame(out, schema={k: schema[k] for k in out})
