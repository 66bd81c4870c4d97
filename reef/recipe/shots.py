"""Few-shot examples for a harness (`shots.jsonl`, reef.registry.harness), mined from experience: the
replies a scenario's reward accepted and the corrections its reports carried.

A small model copies a format it is shown far better than one it is told, so a harness that shows a
few accepted replies is often the cheapest release there is: no training, gated like any other.
Where a shot comes from:
- a **rewarded reply** (a record scoring at least the recipe's threshold): the user's message and
  the reply as served, its tool calls kept (a tool call is the format a tool scenario most needs
  shown). Only a reply that answers the user's message directly: a record whose conversation goes
  on after the user's last message (tool results, an agent's earlier turns) would lose that context
  as a two-turn example, so it is left out;
- a **correction** (a low-reward reply whose report said what was wanted): the user's message and
  the correction.

`pick_shots` takes corrections first, then rewarded replies, oldest first, one example per distinct
reply before any repeats, so the examples show the range of wanted replies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from reef.experience.schema import correction_message
from reef.registry.harness import SHOTS_FILE


@dataclass(frozen=True)
class Shot:
    """One example: the user's message and the wanted reply (text, and the calls it made)."""

    user: str
    reply: str
    tool_calls: tuple[tuple[str, str], ...] = field(default=())  # (name, arguments as JSON text)

    def line(self) -> str:
        """Its `shots.jsonl` line."""
        row: dict[str, Any] = {"user": self.user, "assistant": self.reply}
        if self.tool_calls:
            row["tool_calls"] = [{"name": name, "arguments": arguments} for name, arguments in self.tool_calls]
        return json.dumps(row, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class Rewarded:
    """A reply the scenario's reward accepted: what the model was sent (the harness applied), its
    reply and tool calls, and the score."""

    record_id: str
    messages: list[dict[str, Any]]
    reply: str
    score: float
    tool_calls: tuple[tuple[str, str], ...] = ()

    def shot(self) -> Shot | None:
        """The example it makes; None when it does not answer the user's message directly."""
        if not self.messages or self.messages[-1]["role"] != "user" or not (self.reply or self.tool_calls):
            return None
        return Shot(self.messages[-1]["content"], self.reply, self.tool_calls)


def rewarded_replies(frame: pl.DataFrame, at_least: float) -> list[Rewarded]:
    """The snapshot's reported records scoring at least `at_least`, one per recorded choice, oldest first."""
    rows = frame.filter(pl.col("score").is_not_null() & (pl.col("score") >= at_least)).select(
        "record_id", "messages", "choices", "score").to_dicts()
    out = []
    for row in rows:
        messages = [{"role": m["role"], "content": m.get("content") or ""} for m in row["messages"] or ()]
        for choice in row["choices"] or ():
            calls = tuple((c.get("name") or "", c.get("arguments") or "{}") for c in choice.get("tool_calls") or ()
                          if c.get("name"))
            out.append(Rewarded(row["record_id"], messages, choice.get("content") or "", float(row["score"]), calls))
    return out


def correction_shot(messages: list[dict[str, Any]], correction: str | None) -> Shot | None:
    """The example a corrected reply makes: the last user message and the correction (its text, or
    the tool calls of a correction given as an assistant message)."""
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    if not correction or not user:
        return None
    message = correction_message(correction)
    if message is None:
        return Shot(user, correction)
    calls = tuple(_call(c) for c in message.get("tool_calls") or ())
    text = message.get("content") or ""
    return Shot(user, text, calls) if text or calls else None


def _call(raw: dict[str, Any]) -> tuple[str, str]:
    function = raw.get("function") or raw
    arguments = function.get("arguments") or "{}"
    return function.get("name") or "", arguments if isinstance(arguments, str) else json.dumps(arguments)


def pick_shots(shots: list[Shot | None], limit: int) -> list[Shot]:
    """Up to `limit` examples, in order, one per distinct reply before any repeats (the same example
    twice is one)."""
    unique = list(dict.fromkeys(s for s in shots if s is not None))
    first: dict[tuple[str, tuple[tuple[str, str], ...]], Shot] = {}
    for shot in unique:
        first.setdefault((shot.reply, shot.tool_calls), shot)
    distinct = list(first.values())
    return (distinct + [s for s in unique if s not in distinct])[:limit]


def shots_file(shots: list[Shot]) -> tuple[str, str]:
    """(path, content) of the harness file holding `shots`."""
    return SHOTS_FILE, "".join(s.line() for s in shots)
