"""Shared fixtures: one real vLLM server with the tiny model for the whole session, and real
`reef serve` gateway processes in front of it (real processes, so crash tests can kill -9 them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from reef.config import ServeConfig
from reef.engine.supervisor import EngineSupervisor
from tests.helpers import ARTIFACTS, MODEL_NAME, REPO, TINY
from tests.helpers.gateway import Gateway

# Fixtures: the state tests on both backends; a fresh database named in REEF_STATE__URL; the server.
from tests.helpers.postgres import backend, pg_url, postgres  # noqa: F401
from tests.helpers.state_pass import state_per_module, state_per_test, state_server  # noqa: F401 (fixtures)
from tests.helpers.tiny import declare_scenarios

# The scenarios the tiny model's corpus taught (demo-add, demo-rules) are declared by the tests, as a
# package would declare its own (entry points): here, and in every process a test starts.
declare_scenarios()

# vLLM compiles the model at every start into a cache under its data dir, and most tests start it
# in a fresh temp dir: one cache per xdist worker instead (the model and flags are the same), so
# only a worker's first start compiles and inspects the model (~20 s of CPU each time otherwise).
# Per worker, because two cold compiles into one folder at once are not known to be safe.
_ENGINE_CACHE = ARTIFACTS / "engine-cache" / os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault("VLLM_CACHE_ROOT", str(_ENGINE_CACHE / "vllm"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_ENGINE_CACHE / "inductor"))

# A learner's round runs `learner.round_nice` (10) below the server so users keep the CPU; in the
# suite, though, the other worker's tests take the CPU at priority 0 and a niced round waits behind
# them (measured: the demo's 8 training steps unfinished after 10 minutes beside other tests). The
# servers the tests start run their rounds at their own priority; tests/test_round_priority.py
# checks the default itself.
os.environ.setdefault("REEF_LEARNER__ROUND_NICE", "0")

# `make test` runs the suite in two phases (see the Makefile): `-m model_free` on one core while the
# default model builds on the other, then `-m "not model_free"` on two xdist workers. Each test file
# says which phase it belongs to with the markers declared in pyproject.toml (`model_free`,
# `any_model`); this file only orders them.
QUICK_MODEL_STEPS = 120  # enough to learn the chat format and stop at <|im_end|>: replies stay short
# nbmake's items are notebooks, which cannot carry markers: their `start_early` ranks, among the
# test files' own (`pytestmark`), live here.
NOTEBOOK_RANKS = {
    "tests/notebooks/01_explore_experience.ipynb": 6, "tests/notebooks/03_compare_and_release.ipynb": 7,
    "tests/notebooks/04_evolve_a_harness.ipynb": 10,
}


def start_rank(item: pytest.Item) -> float:
    marker = item.get_closest_marker("start_early")
    return marker.args[0] if marker else NOTEBOOK_RANKS.get(item.nodeid.split("::")[0], float("inf"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `--dist loadfile` hands files out in collection order (the Makefile turns off its reordering
    # by test count), so the long files start early instead of running alone at the end.
    items.sort(key=start_rank)  # stable: the order within a rank, and of the unranked files, is kept


def _refuse_in_model_free_phase() -> None:
    if os.environ.get("REEF_TEST_MODEL_FREE"):
        pytest.fail("this test runs in the model-free phase but needs the default model: "
                    "take its `model_free` marker off")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from tests.helpers.tiny.model import build_tiny, is_current

    _refuse_in_model_free_phase()
    # `make test` builds it first; a stale one (another corpus) would fail tests for the wrong reason.
    if not is_current(TINY):
        build_tiny(TINY, seed=0)
    return TINY


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the tiny model, for tests that train or load it with other settings."""
    from tests.helpers.models import copy_tiny

    _refuse_in_model_free_phase()
    return copy_tiny(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def serving_model(request: pytest.FixtureRequest) -> Path:
    """The checkpoint the session's engines serve: the default model, or in the model-free phase
    (the default model is still being built) a quick build with its tokenizer and chat format."""
    if not os.environ.get("REEF_TEST_MODEL_FREE"):
        return request.getfixturevalue("tiny_model")
    from tests.helpers.tiny.model import build_tiny, is_current

    quick = ARTIFACTS / "quick-model"
    ARTIFACTS.mkdir(exist_ok=True)
    # Both xdist workers want it: one builds, the other waits (a second build would replace the
    # folder under the first worker's engine).
    with FileLock(ARTIFACTS / "quick-model.lock"):
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
