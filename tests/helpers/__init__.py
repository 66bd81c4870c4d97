"""What the test files share, so that none imports another: common paths and names here, the rest by concern."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "data" / "models" / "tiny"
MODEL_NAME = "reef-tiny"  # the name the session's vLLM serves its checkpoint under
ARTIFACTS = REPO / "test-artifacts"


def wait_for(condition: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def gated_tasks(metrics: dict, suite_size: int) -> int:
    """The tasks a gate's metrics must have judged: the whole suite, unless it selected early at a
    look (gate.looks), then the tasks it had sampled."""
    return metrics["tasks_sampled"] if metrics.get("stopped_early") else suite_size
