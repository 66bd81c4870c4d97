"""Crash points: `REEF_CRASH_AT=<name>[,<name>...]` makes the process `kill -9` itself when it
reaches a named point, so tests and bench/faults.py crash at the exact moment that matters (a
swap between loading the weights and appending the release, a round between training and
registering) instead of racing a timer. Unset, a crash point costs one dictionary lookup.

    release:loaded    the publisher loaded and proved the content, before the chain append
    release:appended  the chain holds the release, before the route switches
    round:trained     the candidate is written and its records consumed, before registration
"""

from __future__ import annotations

import os
import signal

ENV = "REEF_CRASH_AT"


def crash_point(name: str) -> None:
    wanted = os.environ.get(ENV)
    if wanted and name in wanted.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
