"""`GET /reef/harness/install`: the Pi install script run with `sh` in a temp HOME against a live
`reef serve`, with the real Pi from npm (the project's `make pi` copy when there is one, else the
script installs the pinned version itself), then `reef-pi -p ...` recorded in the scenario with the
served harness, `reef-pi report` accepted and `reef-pi update` pulling a newer harness.

Pi runs with `--no-tools` and under `timeout` (and the script's turn cap): with its tools, a small
model may call them forever.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from reef.client import ReefClient
from reef.registry.candidates import CandidateRegistry, GateResult, register_candidate
from tests.helpers import MODEL_NAME, REPO, TINY
from tests.helpers.gateway import Gateway

pytestmark = pytest.mark.vllm

TOKEN = "install-admin-token-never-in-a-script"
S = "pi-install"
MAKE_PI = REPO / ".pi-agent" / "node_modules" / ".bin"


def harness(folder: Path, system: str) -> Path:
    (folder / "skills" / "add").mkdir(parents=True)
    (folder / "system.md").write_text(system + "\n")
    (folder / "rules.md").write_text("Answer briefly.\n")
    (folder / "skills" / "add" / "SKILL.md").write_text("---\nname: add\ndescription: add two numbers\n---\nAdd.\n")
    (folder / "candidate.json").write_text(json.dumps({"kind": "harness", "scenario": S}))
    return folder


def release_harness(api: ReefClient, data: Path, folder: Path) -> dict:
    view = register_candidate(data, folder)
    head = api.head(S)
    CandidateRegistry(data, S).record_gate(view.candidate_id, GateResult(
        decision="select", reason="recorded by the test", head_release_id=head))
    return api.release(S, view.candidate_id, head)["release"]


@pytest.fixture(scope="module")
def gw(vllm_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("install")
    (work / "serve.yaml").write_text(yaml.safe_dump({
        "served_model_name": MODEL_NAME, "admin_token": TOKEN, "store": {"flush_interval_s": 0.2}}))
    gateway = Gateway(work, vllm_url, ["--model", str(TINY)]).start()
    yield gateway
    gateway.stop()


def test_adapters_and_forwarded_address(gw: Gateway) -> None:
    bad = httpx.get(f"{gw.url}/reef/harness/install", params={"adapter": "claude"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "adapter"
    assert "openai, pi" in bad.json()["error"]["message"]
    proxied = {"x-forwarded-host": "reef.example.com", "x-forwarded-proto": "https"}
    env = httpx.get(f"{gw.url}/reef/harness/install", params={"adapter": "openai", "scenario": S}, headers=proxied,
                    timeout=30).text
    assert "export OPENAI_BASE_URL=https://reef.example.com/v1" in env and f"REEF_SCENARIO={S}" in env
    script = httpx.get(f"{gw.url}/reef/harness/install", params={"adapter": "pi", "scenario": S}, headers=proxied,
                       timeout=30).text
    assert '"baseUrl": "https://reef.example.com/v1"' in script
    for text in (env, script):
        assert TOKEN not in text
    # A scenario nobody released to: its base release, no harness, and the GET creates no chain.
    fresh = httpx.get(f"{gw.url}/reef/harness", params={"scenario": "never-released"}, timeout=30).json()
    assert (fresh["release_id"], fresh["harness_id"], fresh["files"]) == ("never-released@r0", None, {})
    assert not (gw.data_dir / "releases" / "never-released").exists()


def test_install_pi_run_report_update(gw: Gateway, tmp_path: Path) -> None:
    api = ReefClient(gw.url, admin_token=TOKEN)
    data = gw.workdir / "data"
    api.releases(S)  # the scenario's r0, which the gate result names
    first = release_harness(api, data, harness(tmp_path / "h1", "You are a calculator."))

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    path = f"{home / '.local' / 'bin'}:{os.environ['PATH']}"
    if MAKE_PI.is_dir():  # `make pi` installed the pinned Pi: the script uses the one on PATH
        path = f"{MAKE_PI}:{path}"
    env = {**os.environ, "HOME": str(home), "PATH": path, "REEF_PI_MAX_TURNS": "2"}
    env.pop("REEF_HOME", None)
    script = httpx.get(f"{gw.url}/reef/harness/install", params={"adapter": "pi", "scenario": S}, timeout=30).text
    done = subprocess.run(["sh", "-s"], input=script, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    agent = home / ".reef" / "pi" / "agent"
    assert (agent / "SYSTEM.md").read_text() == "You are a calculator.\n"
    assert (agent / "AGENTS.md").read_text() == "Answer briefly.\n"
    assert (agent / "skills" / "add" / "SKILL.md").read_text().startswith("---\nname: add")
    provider = json.loads((agent / "models.json").read_text())["providers"]["reef"]
    assert provider["baseUrl"] == f"{gw.url}/v1" and provider["headers"]["x-reef-scenario"] == S

    def reef_pi(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["timeout", "-k", "5", "120", "reef-pi", *args], env=env, cwd=work,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=150)

    ran = reef_pi("--no-tools", "--no-session", "-p", "What is 2 + 3?")
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    receipts = [json.loads(line) for line in (home / ".reef" / "pi" / "receipts.jsonl").read_text().splitlines()]
    assert receipts and all(r["status"] == 200 and r["release_id"] == first["release_id"] for r in receipts)
    for receipt in receipts:
        record = httpx.get(f"{gw.url}/reef/records/{receipt['record_id']}", timeout=30).json()
        assert record["scenario"] == S and record["release_id"] == first["release_id"]
        assert record["gen_ai.conversation.id"] == receipt["session"]  # the wrapper's session header
        assert "You are a calculator." in record["messages"][0]["content"]  # Pi read SYSTEM.md

    assert reef_pi("report").returncode == 2
    reported = reef_pi("report", "--score", "1", "--feedback", "added \"right\"")
    assert reported.returncode == 0, reported.stderr
    assert set(json.loads(reported.stdout)["agent_record_ids"]) == {r["record_id"] for r in receipts}

    release_harness(api, data, harness(tmp_path / "h2", "You are a careful calculator."))
    updated = reef_pi("update")
    assert updated.returncode == 0, updated.stderr
    assert (agent / "SYSTEM.md").read_text() == "You are a careful calculator.\n"
