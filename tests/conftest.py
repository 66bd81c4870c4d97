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
# vLLM compiles the model at every start into a cache under its data dir, and most tests start it
# in a fresh temp dir: one cache per xdist worker instead (the model and flags are the same), so
# only a worker's first start compiles and inspects the model (~20 s of CPU each time otherwise).
# Per worker, because two cold compiles into one folder at once are not known to be safe.
_ENGINE_CACHE = ARTIFACTS / "engine-cache" / os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault("VLLM_CACHE_ROOT", str(_ENGINE_CACHE / "vllm"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_ENGINE_CACHE / "inductor"))

# `make test` runs the suite in two phases (see the Makefile): the model-free tests on one core while
# the default model builds on the other, then the rest on two xdist workers. A test is model-free
# when its file is in MODEL_FREE_FILES or ANY_MODEL_FILES, or its file is in MIXED_FILES and it asks
# for none of MODEL_FIXTURES.
MODEL_FREE_FILES = {
    "test_artifacts.py", "test_cpu_lora_fix.py", "test_demo_boundary.py", "test_durable.py", "test_layers.py",
    "test_load.py", "test_notebooks_clean.py", "test_record_row.py", "test_release_chain.py", "test_sse_split.py",
    "test_state_machines.py", "test_store.py", "test_supervisor.py",
}
# Tests of the engine's and gateway's mechanics (lifecycle, contract, fuzzing): they
# need a real vLLM serving a real checkpoint, not what the default model has learnt. In the
# model-free phase their engines serve `serving_model`'s quick build; they must not ask for
# `tiny_model` or `tiny` (the guard below fails them if they do).
ANY_MODEL_FILES = {
    "test_serve_managed.py", "test_fuzz.py", "test_contract.py", "test_gateway.py", "test_crash.py", "test_http1.py",
    "test_cli.py", "test_any_upstream.py",
}
MIXED_FILES = {"test_tiny_model.py", "test_scenarios.py"}
MODEL_FIXTURES = {"tiny_model", "tiny", "serving_model", "vllm_url", "gateway", "make_gateway"}
QUICK_MODEL_STEPS = 120  # enough to learn the chat format and stop at <|im_end|>: replies stay short
# Files by their share of the suite's time, longest first: `--dist loadfile` hands files out in
# collection order (the Makefile turns off its reordering by test count), so the long ones start
# early instead of running alone at the end.
LONGEST_FIRST = [
    "tests/test_dvc_pipeline.py", "tests/test_scenario_learning.py", "tests/test_release_swap.py",
    "tests/test_candidate_vllm.py", "tests/test_serve_managed.py", "notebooks/01_explore_experience.ipynb",
    "notebooks/03_compare_and_release.ipynb", "tests/test_dashboard_browser.py", "tests/test_gate_engine.py",
    "notebooks/04_evolve_a_harness.ipynb", "tests/test_tiny_model.py", "tests/test_next_turn.py",
    "tests/test_gateway.py", "tests/test_scenarios.py", "tests/test_crash.py", "tests/test_fuzz.py",
    "tests/test_contract.py",
]


def is_model_free(item: pytest.Item) -> bool:
    name = item.path.name
    if name in MODEL_FREE_FILES or name in ANY_MODEL_FILES:
        return True
    return name in MIXED_FILES and not MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept
    for item in items:
        if is_model_free(item):
            item.add_marker(pytest.mark.model_free)


def _refuse_in_model_free_phase() -> None:
    if os.environ.get("REEF_TEST_MODEL_FREE"):
        pytest.fail("this test runs in the model-free phase but needs the default model: "
                    "take it out of MODEL_FREE_FILES / MIXED_FILES in tests/conftest.py")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from reef.model.tiny import build_tiny, is_current

    _refuse_in_model_free_phase()
    # `make test` builds it first; a stale one (another corpus) would fail tests for the wrong reason.
    if not is_current(TINY):
        build_tiny(TINY, seed=0)
    return TINY


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the tiny model, for tests that train or load it with other settings."""
    from tests.recipe_support import copy_tiny

    _refuse_in_model_free_phase()
    return copy_tiny(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def serving_model(request: pytest.FixtureRequest) -> Path:
    """The checkpoint the session's engines serve: the default model, or in the model-free phase
    (the default model is still being built) a quick build with its tokenizer and chat format."""
    if not os.environ.get("REEF_TEST_MODEL_FREE"):
        return request.getfixturevalue("tiny_model")
    from reef.model.tiny import build_tiny, is_current

    quick = ARTIFACTS / "quick-model"
    if not is_current(quick, steps=QUICK_MODEL_STEPS):
        build_tiny(quick, seed=0, progress=False, steps=QUICK_MODEL_STEPS, evaluate=False)
    return quick


@pytest.fixture(scope="session")
def vllm_url(serving_model: Path) -> Iterator[str]:
    # For quick iteration on the gateway: reuse a vLLM you started yourself (serving MODEL_NAME).
    if os.environ.get("REEF_TEST_UPSTREAM"):
        yield os.environ["REEF_TEST_UPSTREAM"]
        return
    config = ServeConfig(model=str(serving_model), served_model_name=MODEL_NAME, data_dir=REPO / "data")
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
