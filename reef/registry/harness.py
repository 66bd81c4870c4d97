"""A harness: the text half of an agent (its model is the other), stored as a content-addressed artifact.

    system.md                 the system prompt
    rules.md                  rules the agent must follow (appended to the system prompt)
    skills/<name>/SKILL.md    skills, Agent Skills style (front matter `name`, `description`)
    shots.jsonl               few-shot examples, one `{"user": ..., "assistant": ...}` per line, with
                              `"tool_calls": [{"name": ..., "arguments": "<JSON text>"}]` where the
                              reply was a tool call: put in as earlier turns after the system prompt
                              (a small model copies a format it is shown far better than one it is told)
    examples/...              few-shot examples, tool descriptions, anything else: served to clients as files

Served two ways: the gateway puts `system_prompt()` into each request of a scenario whose
`harness.inject` says so (reef.gateway.routes.harness), and clients fetch every file with
`GET /reef/harness` (agents such as Pi write them where they read their prompt and skills).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.registry.artifacts import ArtifactError, ArtifactStore

SYSTEM_FILE = "system.md"
RULES_FILE = "rules.md"
SHOTS_FILE = "shots.jsonl"
SKILLS_DIR = "skills"


@dataclass(frozen=True)
class Harness:
    content_id: str
    files: dict[str, str]  # relative path -> text

    def system_prompt(self) -> str:
        """What the gateway injects: the system prompt, then the rules."""
        parts = [self.files[SYSTEM_FILE].strip()] if SYSTEM_FILE in self.files else []
        if RULES_FILE in self.files:
            parts.append(self.files[RULES_FILE].strip())
        return "\n\n".join(p for p in parts if p)

    def shots(self) -> list[tuple[str, str]]:
        """The few-shot examples of shots.jsonl as (user, assistant) pairs; lines that are not such an
        object are left out (a hand-written file must not take the scenario down)."""
        return [(shot["user"], shot["assistant"]) for shot in self._shot_lines()]

    def shot_turns(self) -> list[dict[str, Any]]:
        """The few-shot examples as the chat messages they are put in as: a user turn, then the
        assistant's, which carries its `tool_calls` in the OpenAI shape (arguments as JSON text) so
        the chat template writes the call as the model writes one (SmolLM2: `<tool_call>` markup)."""
        turns: list[dict[str, Any]] = []
        for n, shot in enumerate(self._shot_lines()):
            reply: dict[str, Any] = {"role": "assistant", "content": shot["assistant"]}
            calls = [c for c in shot.get("tool_calls") or () if isinstance(c, dict) and isinstance(c.get("name"), str)]
            if calls:
                reply["tool_calls"] = [{"id": f"call_shot{n}_{k}", "type": "function", "function": {
                    "name": c["name"], "arguments": _arguments_text(c.get("arguments"))}} for k, c in enumerate(calls)]
            turns += [{"role": "user", "content": shot["user"]}, reply]
        return turns

    def _shot_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.files.get(SHOTS_FILE, "").splitlines():
            try:
                shot = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(shot, dict) and isinstance(shot.get("user"), str) and isinstance(shot.get("assistant"), str):
                out.append(shot)
        return out

    def skills(self) -> dict[str, str]:
        """Skill name -> its SKILL.md text."""
        out = {}
        for path, text in self.files.items():
            parts = path.split("/")
            if len(parts) == 3 and parts[0] == SKILLS_DIR and parts[2] == "SKILL.md":
                out[parts[1]] = text
        return out


def _arguments_text(arguments: Any) -> str:
    """A call's arguments as the JSON text the OpenAI API carries (a shot may hold them as an object)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


@functools.lru_cache(maxsize=64)
def _load(root: str, content_id: str) -> Harness:
    store = ArtifactStore(root, fsync=False)
    manifest = store.get(content_id)
    if manifest.kind != "harness":
        raise ArtifactError(f"content {content_id} is a {manifest.kind} artifact, not a harness")
    folder = store.verify(content_id)  # once per content id: the content never changes under its id
    return Harness(content_id, {f.path: (folder / f.path).read_text(encoding="utf-8") for f in manifest.files})


def load_harness(store: ArtifactStore, content_id: str) -> Harness:
    """The verified harness `content_id` (cached: content ids name immutable content)."""
    return _load(str(Path(store.root).resolve()), content_id)


def inject(messages: list[dict[str, Any]], harness: Harness, mode: str) -> list[dict[str, Any]]:
    """`messages` with the harness's system prompt applied: `system_prepend` puts it before the
    client's own system prompt (one system message: chat templates take one), `system_replace`
    drops the client's system messages for it. The harness's few-shot examples follow the system
    prompt as earlier user and assistant turns (an assistant turn with its tool calls, when the
    example's reply was a call), before the client's conversation."""
    prompt, turns = harness.system_prompt(), harness.shot_turns()
    if mode == "off" or not (prompt or turns):
        return messages
    rest = list(messages)
    own = rest.pop(0) if rest and rest[0].get("role") in ("system", "developer") else None
    if not prompt:
        return [*([own] if own is not None else []), *turns, *rest]
    if mode == "system_replace" or own is None:
        return [{"role": "system", "content": prompt}, *turns, *rest]
    content = own.get("content")
    if isinstance(content, list):  # content parts (Pi sends them): keep the client's parts as they are
        merged: str | list[Any] = [{"type": "text", "text": prompt + "\n\n"}, *content]
    else:
        merged = f"{prompt}\n\n{content or ''}".rstrip()
    return [{**own, "role": own.get("role", "system"), "content": merged}, *turns, *rest]
