"""Session stitching without a session header.

A chat client resends the whole conversation each turn. A request whose messages start with an
earlier record's messages followed by that record's reply continues that record's session. We
keep a rolling hash per message prefix; each record stores the hashes of (its messages + each
choice's reply), and a new request looks up its own prefixes, longest first, among the records of
its own scenario: a session is one scenario's, so the same conversation sent under two scenarios
(or through two dialects, each its own scenario) gives two sessions, each reported on and learned
from by its own scenario.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import orjson


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a multi-part content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _arguments(arguments: Any) -> str:
    """Arguments compared by value: agents parse the model's JSON and send it back re-serialised
    (`{"a":1}` for the model's `{"a": 1}`), or as an object."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    try:
        return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return str(arguments)


def _tool_calls(calls: Any) -> list[list[str]]:
    out = []
    for call in calls or []:
        fn = (call or {}).get("function") or {}
        out.append([str(fn.get("name", "")), _arguments(fn.get("arguments", ""))])
    return out


def message_key(message: dict[str, Any]) -> bytes:
    """What must match for two messages to count as the same turn (ids and extras may differ)."""
    return orjson.dumps(
        [message.get("role", ""), _text(message.get("content")), _tool_calls(message.get("tool_calls"))]
    )


def _roll(previous: str, message: dict[str, Any]) -> str:
    return hashlib.sha256(previous.encode() + message_key(message)).hexdigest()[:32]


def prefix_hashes(messages: list[dict[str, Any]]) -> list[str]:
    """hashes[i] identifies messages[: i + 1]."""
    hashes, current = [], ""
    for message in messages:
        current = _roll(current, message)
        hashes.append(current)
    return hashes


def reply_hashes(messages: list[dict[str, Any]], replies: list[dict[str, Any]], base: str | None = None) -> list[str]:
    """One hash per reply: the conversation as the client will resend it next turn. `base`: the
    last of `prefix_hashes(messages)`, when the caller has them already."""
    if base is None:
        base = prefix_hashes(messages)[-1] if messages else ""
    return [_roll(base, reply) for reply in replies]


class SessionIndex:
    """(scenario, reply hash) -> session id, for every record this server has seen."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, scenario: str, hashes: list[str], session_id: str) -> None:
        with self._lock:
            for h in hashes:
                self._sessions.setdefault((scenario, h), session_id)

    def lookup(self, scenario: str, messages: list[dict[str, Any]], hashes: list[str] | None = None) -> str | None:
        """`hashes`: `prefix_hashes(messages)`, when the caller has them already."""
        if hashes is None:
            hashes = prefix_hashes(messages)
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].get("role") == "assistant":
                found = self._sessions.get((scenario, hashes[i]))
                if found is not None:
                    return found
        return None
