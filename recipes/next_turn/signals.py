"""Next-turn signals: what the turn after a reply says about it, as a reward and a hindsight hint,
without any report (OpenClaw-RL's idea: the next state of a conversation is feedback).

In a session, turn k+1's request resends turn k's messages, turn k's reply, and then what came
next: the user's next message (a doubt, a correction, a thank-you) or a tool's result. The
scenario declares how to read it (`Scenario.next_turn`): rules (a regular expression on the next
message gives the reply a reward) and, for next turns no rule matches, optionally a judge that reads
the reply and the next turn (`votes` calls averaged). Turn k+1's served prompt is turn k's context
*with the hint appended* (its own reply, then the next message), and its reply is the model
re-prompted with that hint: when that reply is in turn judged good by ITS next turn, it is a better
target for turn k's original prompt (hindsight distillation), from recorded ids only.

    signals = next_turn_signals(snapshot.frame(), scenario.next_turn)

One row per assistant turn that has a next turn in the frame: record_id, session_id, prompt_ids,
completion_ids, logprobs, weight, messages (as served), next_role, next_text, reward (None when
nothing could read the next turn), source ("rule <i>" | "judge" | None), and the hinted turn:
hinted_record_id, hinted_prompt_ids, hinted_completion_ids, hinted_reward (the hinted reply's own
next-turn reward, when it has one).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import polars as pl

from reef.experience.load import SESSION_COL
from reef.scenario import NextTurnSpec, RewardFn

SCHEMA: dict[str, Any] = {
    "record_id": pl.String, "session_id": pl.String, "prompt_ids": pl.List(pl.Int64),
    "completion_ids": pl.List(pl.Int64), "logprobs": pl.List(pl.Float64), "weight": pl.Float64,
    "messages": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
    "next_role": pl.String, "next_text": pl.String, "reward": pl.Float64, "source": pl.String,
    "hinted_record_id": pl.String, "hinted_prompt_ids": pl.List(pl.Int64),
    "hinted_completion_ids": pl.List(pl.Int64), "hinted_reward": pl.Float64,
}


def _said(messages: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"] or "") for m in messages]


def _served_choice(choices: Sequence[dict[str, Any]], reply: str | None) -> dict[str, Any] | None:
    """The choice the conversation went on with (the one whose text the next request resent)."""
    sampled = [c for c in choices if c["token_ids"]]
    for c in sampled:
        if reply is not None and (c["content"] or "") == reply:
            return c
    return sampled[0] if sampled else None


def _next_message(turn: dict[str, Any], after: dict[str, Any]) -> tuple[str, str] | None:
    """The first message `after` adds behind `turn`'s messages and reply, when `after` continues
    `turn` at all (same messages first: a session a client forked or edited does not)."""
    said, later = _said(turn["messages"]), _said(after["messages"])
    n = len(said)
    if len(later) < n + 2 or later[:n] != said or later[n][0] != "assistant":
        return None
    role, text = later[n + 1]
    return (role, text) if role in ("user", "tool") else None


def read_next_turn(spec: NextTurnSpec, role: str, text: str) -> tuple[float | None, str | None]:
    """The reward the first matching rule gives, and which rule it was."""
    for i, rule in enumerate(spec.rules):
        if rule.role == role and re.search(rule.pattern, text, re.IGNORECASE):
            return rule.reward, f"rule {i}"
    return None, None


def next_turn_signals(frame: pl.DataFrame, spec: NextTurnSpec, judge: RewardFn | None = None) -> pl.DataFrame:
    """See the module docstring. `judge`: the scenario's next-turn judge as a reward function
    (`reef.scenario.reward.judge_reward(spec.judge, ...)`), asked only where no rule matched."""
    weight = "weight" if "weight" in frame.columns else None
    columns = [SESSION_COL, "record_id", "created_at", "messages", "prompt_token_ids", "choices"]
    rows = frame.select(*columns, *([weight] if weight else [])).sort(SESSION_COL, "created_at", "record_id").to_dicts()
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_session.setdefault(row[SESSION_COL], []).append(row)
    out: list[dict[str, Any]] = []
    for session_id, turns in by_session.items():
        for turn, after in zip(turns, turns[1:], strict=False):
            nxt = _next_message(turn, after)
            if nxt is None:
                continue
            choice = _served_choice(turn["choices"], after["messages"][len(turn["messages"])]["content"])
            hinted = _served_choice(after["choices"], None)
            if choice is None or hinted is None or not turn["prompt_token_ids"]:
                continue
            reward, source = read_next_turn(spec, *nxt)
            out.append({
                "record_id": turn["record_id"], "session_id": session_id,
                "prompt_ids": list(turn["prompt_token_ids"]), "completion_ids": list(choice["token_ids"]),
                "logprobs": list(choice["logprobs"] or []), "weight": turn[weight] if weight else 1.0,
                "messages": [{"role": m["role"], "content": m["content"]} for m in turn["messages"]],
                "next_role": nxt[0], "next_text": nxt[1], "reward": reward, "source": source,
                "hinted_record_id": after["record_id"], "hinted_prompt_ids": list(after["prompt_token_ids"]),
                "hinted_completion_ids": list(hinted["token_ids"]), "hinted_reward": None,
                "_reply": choice["content"] or "",
            })
    if judge is not None:
        unread = [r for r in out if r["reward"] is None]
        if unread:
            # The judge grades the reply in the light of what came next; `votes` calls are averaged.
            tasks = [{"messages": r["messages"]} for r in unread]
            replies = [f"{r['_reply']}\n\n(The next turn, from the {r['next_role']}: {r['next_text']})" for r in unread]
            for r, score in zip(unread, judge(tasks, replies), strict=True):
                if score.value is not None:
                    r["reward"], r["source"] = score.value, "judge"
    by_record = {r["record_id"]: r for r in out}
    for r in out:
        later = by_record.get(r["hinted_record_id"])
        r["hinted_reward"] = later["reward"] if later is not None else None
        r.pop("_reply")
    return pl.DataFrame(out, schema=SCHEMA)
