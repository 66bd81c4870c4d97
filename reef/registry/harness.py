"""A harness: the text half of an agent (its model is the other), stored as a content-addressed artifact.

    system.md                 the system prompt
    rules.md                  rules the agent must follow (appended to the system prompt)
    skills/<name>/SKILL.md    skills, Agent Skills style (front matter `name`, `description`)
    shots.jsonl               few-shot examples, one `{"user": ..., "assistant": ...}` per line: put in
                              as earlier turns after the system prompt (a small model copies a format
                              it is shown far better than one it is told)
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
        out = []
        for line in self.files.get(SHOTS_FILE, "").splitlines():
            try:
                shot = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(shot, dict) and isinstance(shot.get("user"), str) and isinstance(shot.get("assistant"), str):
                out.append((shot["user"], shot["assistant"]))
        return out

    def skills(self) -> dict[str, str]:
        """Skill name -> its SKILL.md text."""
        out = {}
        for path, text in self.files.items():
            parts = path.split("/")
            if len(parts) == 3 and parts[0] == SKILLS_DIR and parts[2] == "SKILL.md":
                out[parts[1]] = text
        return out


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
    prompt as earlier user and assistant turns, before the client's conversation."""
    prompt, shots = harness.system_prompt(), harness.shots()
    if mode == "off" or not (prompt or shots):
        return messages
    rest = list(messages)
    own = rest.pop(0) if rest and rest[0].get("role") in ("system", "developer") else None
    turns = [{"role": role, "content": text} for user, reply in shots
             for role, text in (("user", user), ("assistant", reply))]
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
