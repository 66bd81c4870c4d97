"""`reef connect <agent>`: point an agent's own config at a running `reef serve`, and undo it.

Unlike the install scripts (`reef.gateway.install_agents`, which write a folder of Reef's own and a
wrapper), this writes where the agent reads by itself, so the plain `codex`, `claude`, `opencode` or
`pi` talks to Reef. The configs are the install adapters': a JSON config is merged into the agent's
(its other providers and settings stay), Codex's TOML is replaced whole (no TOML writer; it comes
back on undo). Before the first write each file is copied into `~/.reef/connect/<agent>/` with a
manifest; `--undo` puts every file back as it was, or removes it when there was none. Connecting
again rewrites the files and keeps the first backup, so undo always returns to the state before Reef.

Where each agent reads its config follows the agent's own variables: `CODEX_HOME`,
`CLAUDE_CONFIG_DIR`, `XDG_CONFIG_HOME`, `PI_CODING_AGENT_DIR`, else their defaults under HOME.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reef.gateway.install_agents import claude_settings, codex_config, opencode_config, pi_models, pi_settings

AGENTS = ("claude-code", "codex", "opencode", "pi")
MANIFEST = "manifest.json"


class ConnectError(Exception):
    """An agent Reef does not know, or an undo with nothing to undo."""


def _deep_merge(base: Any, update: Any) -> Any:
    if isinstance(base, dict) and isinstance(update, dict):
        return {**base, **{k: _deep_merge(base.get(k), v) for k, v in update.items()}}
    return update


def _json_merge(update: dict) -> Callable[[str | None], str]:
    def write(old: str | None) -> str:
        try:
            current = json.loads(old) if old else {}
        except ValueError as exc:  # never overwrite a file the user may still want to fix by hand
            raise ConnectError(f"cannot merge into a file that is not JSON: {exc}") from exc
        return json.dumps(_deep_merge(current if isinstance(current, dict) else {}, update), indent=2) + "\n"
    return write


def _dir(env: Mapping[str, str], var: str, home: Path, default: str) -> Path:
    return Path(env[var]) if env.get(var) else home / default


def agent_files(agent: str, url: str, scenario: str, model: str, context: int, home: Path,
                env: Mapping[str, str]) -> dict[Path, Callable[[str | None], str]]:
    """The files `reef connect` writes for `agent`: path -> new text from the old (None: no file)."""
    if agent == "codex":
        text = codex_config(url, scenario, model, context)
        return {_dir(env, "CODEX_HOME", home, ".codex") / "config.toml": lambda _old: text}
    if agent == "claude-code":
        folder = _dir(env, "CLAUDE_CONFIG_DIR", home, ".claude")
        return {folder / "settings.json": _json_merge(claude_settings(url, scenario, model, context))}
    if agent == "opencode":
        folder = _dir(env, "XDG_CONFIG_HOME", home, ".config") / "opencode"
        return {folder / "opencode.json": _json_merge(opencode_config(url, scenario, model, context))}
    if agent == "pi":
        folder = _dir(env, "PI_CODING_AGENT_DIR", home, ".pi/agent")
        return {folder / "models.json": _json_merge(pi_models(url, scenario, model, context, session_header=False)),
                folder / "settings.json": _json_merge(pi_settings(model, context))}
    raise ConnectError(f"unknown agent {agent!r}; known agents: {', '.join(AGENTS)}")


def backup_dir(agent: str, home: Path) -> Path:
    return home / ".reef" / "connect" / agent


def connect(agent: str, url: str, scenario: str, model: str, context: int, home: Path,
            env: Mapping[str, str]) -> list[Path]:
    """Writes the agent's config; returns the files written."""
    files = agent_files(agent, url, scenario, model, context, home, env)
    backups = backup_dir(agent, home)
    manifest_path = backups / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"files": []}
    known = {entry["path"] for entry in manifest["files"]}
    new_text = {path: make(path.read_text() if path.is_file() else None) for path, make in files.items()}
    backups.mkdir(parents=True, exist_ok=True)
    for path in files:
        if str(path) in known:
            continue  # connected before: the backup holds what was there before Reef
        entry: dict[str, Any] = {"path": str(path), "existed": path.is_file()}
        if path.is_file():
            entry["backup"] = f"{len(manifest['files'])}-{path.name}"
            shutil.copy2(path, backups / entry["backup"])
        manifest["files"].append(entry)
    manifest.update(url=url, scenario=scenario, model=model)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    for path, text in new_text.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


def undo(agent: str, home: Path) -> list[Path]:
    """Puts back every file `connect` changed; returns them."""
    if agent not in AGENTS:
        raise ConnectError(f"unknown agent {agent!r}; known agents: {', '.join(AGENTS)}")
    backups = backup_dir(agent, home)
    manifest_path = backups / MANIFEST
    if not manifest_path.is_file():
        raise ConnectError(f"{agent} is not connected (no {manifest_path})")
    restored = []
    for entry in json.loads(manifest_path.read_text())["files"]:
        path = Path(entry["path"])
        if entry["existed"]:
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(backups / entry["backup"], path)
        else:
            path.unlink(missing_ok=True)
        restored.append(path)
    shutil.rmtree(backups)
    return restored
