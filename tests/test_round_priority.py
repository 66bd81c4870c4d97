"""Serving keeps priority over learning: the learner's round process runs `learner.round_nice` steps
below the server (0: at its priority), and still dies with it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reef.config import ServeConfig
from reef.learn.learner import round_preexec

pytestmark = pytest.mark.model_free

READ_NICE = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"


def _child_nice(nice: int) -> int:
    out = subprocess.run([sys.executable, "-c", READ_NICE], preexec_fn=round_preexec(nice), capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


def test_round_process_runs_below_the_server() -> None:
    here = os.getpriority(os.PRIO_PROCESS, 0)
    assert ServeConfig().learner.round_nice == 10
    assert _child_nice(ServeConfig().learner.round_nice) == min(19, here + 10)
    assert _child_nice(0) == here  # off: the server's own priority
