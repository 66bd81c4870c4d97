"""`reef connect <agent>` writes the agent's own config (merged into what the user had, backed up)
and `--undo` puts every file back as it was; an unknown agent is a clear message and exit code 2.
Model-free: the served model and window are given, no server runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from reef.gateway.connect import AGENTS
from reef.gateway.install_agents import OPENCODE_SHORT_PROMPT

pytestmark = pytest.mark.model_free

URL = "http://127.0.0.1:8900"


def reef(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME", "PI_CODING_AGENT_DIR")}
    return subprocess.run([sys.executable, "-m", "reef.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**env, "HOME": str(home)})


def connect(home: Path, agent: str, *extra: str) -> subprocess.CompletedProcess[str]:
    done = reef(home, "connect", agent, "--url", URL, "--scenario", "coding", "--model", "smollm2-135m-instruct",
                "--context", "8192", *extra)
    assert done.returncode == 0, done.stderr
    return done


def tree(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


def test_connect_writes_each_agent_and_undo_restores_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # What a user had before: their own settings and providers, which connect keeps.
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_text(json.dumps({"theme": "dark", "env": {"MY_VAR": "1"}}))
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text('model = "gpt-5"\n')
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps({"provider": {"mine": {"name": "Mine"}}}))
    before = tree(home)

    for agent in AGENTS:
        out = connect(home, agent).stdout
        assert f"undo: reef connect {agent} --undo" in out
    connect(home, "claude-code")  # again: the backup still holds the user's own file

    claude = json.loads((home / ".claude" / "settings.json").read_text())
    assert claude["theme"] == "dark" and claude["env"]["MY_VAR"] == "1"
    assert claude["env"]["ANTHROPIC_BASE_URL"] == URL and claude["env"]["ANTHROPIC_MODEL"] == "smollm2-135m-instruct"
    assert claude["env"]["ANTHROPIC_CUSTOM_HEADERS"] == "x-reef-scenario: coding"

    codex = tomllib.loads((home / ".codex" / "config.toml").read_text())
    assert codex["model_provider"] == "reef" and codex["model_context_window"] == 8192
    assert codex["model_providers"]["reef"]["base_url"] == f"{URL}/v1"
    assert codex["model_providers"]["reef"]["wire_api"] == "responses"

    opencode = json.loads((home / ".config" / "opencode" / "opencode.json").read_text())
    assert opencode["provider"]["mine"] == {"name": "Mine"} and opencode["model"] == "reef/smollm2-135m-instruct"
    reef_provider = opencode["provider"]["reef"]
    assert reef_provider["npm"] == "@ai-sdk/openai-compatible" and reef_provider["options"]["baseURL"] == f"{URL}/v1"
    # No session header outside the wrapper: an unset $REEF_SESSION would send an empty one.
    assert reef_provider["options"]["headers"] == {"x-reef-scenario": "coding"}
    assert reef_provider["models"]["smollm2-135m-instruct"]["limit"] == {"context": 8192, "output": 2048}
    assert opencode["agent"]["build"]["prompt"] == OPENCODE_SHORT_PROMPT  # a small window: the short prompt

    pi_models = json.loads((home / ".pi" / "agent" / "models.json").read_text())
    assert pi_models["providers"]["reef"]["baseUrl"] == f"{URL}/v1"
    assert pi_models["providers"]["reef"]["headers"] == {"x-reef-scenario": "coding"}
    assert json.loads((home / ".pi" / "agent" / "settings.json").read_text())["defaultProvider"] == "reef"

    for agent in AGENTS:
        done = reef(home, "connect", agent, "--undo")
        assert done.returncode == 0 and "restored" in done.stdout, done.stderr
    assert tree(home) == before  # byte for byte; files that were not there are gone, backups too
    assert not (home / ".reef" / "connect").exists() or not any((home / ".reef" / "connect").iterdir())


def test_the_agents_own_variables_say_where_the_config_goes(tmp_path: Path) -> None:
    from reef.gateway.connect import connect as write
    from reef.gateway.connect import undo

    home = tmp_path / "home"
    env = {"CODEX_HOME": str(tmp_path / "codex"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "CLAUDE_CONFIG_DIR": str(tmp_path / "claude"), "PI_CODING_AGENT_DIR": str(tmp_path / "pi")}
    written = [p for agent in AGENTS for p in write(agent, URL, "s", "m", 4096, home, env)]
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == [
        "claude/settings.json", "codex/config.toml", "pi/models.json", "pi/settings.json", "xdg/opencode/opencode.json"]
    for agent in AGENTS:
        undo(agent, home)
    assert not any(p.exists() for p in written)


def test_a_bad_agent_or_nothing_to_undo_is_exit_2(tmp_path: Path) -> None:
    done = reef(tmp_path, "connect", "cursor", "--model", "m", "--context", "4096")
    assert done.returncode == 2 and "unknown agent 'cursor'" in done.stderr and "opencode" in done.stderr
    done = reef(tmp_path, "connect", "codex", "--model", "m", "--context", "0")
    assert done.returncode == 2 and "--context" in done.stderr
    done = reef(tmp_path, "connect", "codex", "--undo")
    assert done.returncode == 2 and "codex is not connected" in done.stderr
    # A JSON config that does not parse is left alone, not overwritten.
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text("{not json")
    done = reef(tmp_path, "connect", "claude-code", "--model", "m", "--context", "4096")
    assert done.returncode == 2 and "not JSON" in done.stderr
    assert (tmp_path / ".claude" / "settings.json").read_text() == "{not json"


def test_without_a_model_it_asks_the_server(tmp_path: Path) -> None:
    done = reef(tmp_path, "connect", "pi", "--url", "http://127.0.0.1:9")  # nothing listens on port 9
    assert done.returncode == 1 and "cannot reach" in done.stderr
    assert not (tmp_path / ".pi").exists()


def test_the_opencode_install_script_writes_its_config_and_wrapper(tmp_path: Path) -> None:
    """`?adapter=opencode`: Reef's own folder and a wrapper that points OpenCode at it, one session per run."""
    from reef.gateway.install_agents import opencode_script

    fake = tmp_path / "opencode"  # stands in for the agent: prints what the wrapper hands it
    fake.write_text('#!/bin/sh\necho "$OPENCODE_CONFIG $REEF_SESSION $*"\n')
    fake.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "REEF_OPENCODE": str(fake)}
    script = opencode_script(URL, "coding", "smollm2-135m-instruct", 8192)
    done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    config = json.loads((home / ".reef" / "opencode" / "config" / "opencode.json").read_text())
    assert config["provider"]["reef"]["options"]["headers"] == {"x-reef-scenario": "coding",
                                                               "x-reef-session": "{env:REEF_SESSION}"}
    ran = subprocess.run([str(home / ".local" / "bin" / "reef-opencode"), "run", "hi"], capture_output=True,
                         text=True, env=env, timeout=60)
    config_path, session, args = ran.stdout.split(" ", 2)
    assert config_path == str(home / ".reef" / "opencode" / "config" / "opencode.json")
    assert session.startswith("opencode-") and args.strip() == "run hi"
