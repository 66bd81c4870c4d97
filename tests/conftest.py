"""Shared fixtures: one real vLLM server with the tiny model for the whole session, and real
`reef serve` gateway processes in front of it (real processes, so crash tests can kill -9 them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from reef.config import ServeConfig
from reef.engine.supervisor import EngineSupervisor
from reef.serve_process import ServeProcess

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "data" / "models" / "tiny"
MODEL_NAME = "reef-tiny"
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from reef.model.tiny import build_tiny, is_current

    # `make test` builds it first; a stale one (another corpus) would fail tests for the wrong reason.
    if not is_current(TINY):
        build_tiny(TINY, seed=0)
    return TINY


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the tiny model, for tests that train or load it with other settings."""
    from tests.recipe_support import copy_tiny

    return copy_tiny(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def vllm_url(tiny_model: Path) -> Iterator[str]:
    # For quick iteration on the gateway: reuse a vLLM you started yourself (serving MODEL_NAME).
    if os.environ.get("REEF_TEST_UPSTREAM"):
        yield os.environ["REEF_TEST_UPSTREAM"]
        return
    config = ServeConfig(model=str(tiny_model), served_model_name=MODEL_NAME, data_dir=REPO / "data")
    ARTIFACTS.mkdir(exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")  # one session vLLM per xdist worker
    engine = EngineSupervisor(config, ARTIFACTS / f"vllm-session-{worker}.log")
    url = engine.start()
    yield url
    engine.stop()


class Gateway(ServeProcess):
    """A `reef serve` recording in front of the session's vLLM."""

    def __init__(self, workdir: Path, upstream_url: str, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None):
        super().__init__(workdir, ["--upstream-url", upstream_url, *(extra_args or [])], env)

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", default_headers=headers or None,
                             max_retries=0)


@pytest.fixture(scope="module")
def gateway(vllm_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("gateway"), vllm_url).start()
    yield gw
    gw.stop()


@pytest.fixture
def make_gateway(vllm_url: str, tmp_path: Path) -> Iterator[callable]:
    started: list[Gateway] = []

    def make(name: str = "gw", **kwargs: object) -> Gateway:
        gw = Gateway(tmp_path / name, vllm_url, **kwargs)  # type: ignore[arg-type]
        started.append(gw)
        return gw

    yield make
    for gw in started:
        if gw.process is not None:
            gw.stop()
