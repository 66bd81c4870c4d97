"""The engine's reaper: a tiny process that takes vLLM's whole process group down when the gateway
goes away, however it goes (SIGTERM, a crash, `kill -9`).

vLLM's API server spawns EngineCore and Worker processes in its process group; PR_SET_PDEATHSIG
only reaches the API server, and when that one dies without its shutdown (kill -9, OOM) the other
two keep running with GBs of memory. The reaper holds the read end of a pipe whose write end only
the gateway holds: the kernel closes it when the gateway exits, the read returns, and the reaper
signals the group (SIGTERM, then SIGKILL after a grace period).

    python -m reef.engine.reaper PGID FD GRACE_S
"""

from __future__ import annotations

import os
import signal
import sys
import time


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, wait up to `grace_s` for it to go, then SIGKILL what is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    pgid, fd, grace_s = int(argv[0]), int(argv[1]), float(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the gateway's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the pipe's end means "the gateway is gone"
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
    kill_group(pgid, grace_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
