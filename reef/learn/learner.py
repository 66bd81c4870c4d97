"""The learner inside `reef serve`: runs a learning round whenever enough new experience waits.

A round (snapshot -> train -> register -> gate, `python -m reef.learn.round`) runs in a separate
process, so training never blocks serving; the gateway only polls how much experience is pending.
A candidate the gate selects is released at once when the scenario's policy is `auto` (through
the same publisher as the API, expecting the head the gate compared against); under `approval`
it waits in `GET /reef/candidates`. Each round is appended to `<data_dir>/learner/rounds.jsonl`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.config import LearnerConfig, ReleaseConfig

if TYPE_CHECKING:
    from reef.release.publisher import Publisher

log = logging.getLogger("reef.learner")


class Learner:
    def __init__(self, config: LearnerConfig, data_dir: Path, release: ReleaseConfig | None = None):
        self.config = config
        self.release = release or ReleaseConfig()
        self.data_dir = data_dir
        self.publisher: Publisher | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.dir = data_dir / "learner"
        self.rounds_file = self.dir / "rounds.jsonl"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.rounds = 0
        self.last: dict[str, Any] | None = None
        self.last_error: str | None = None
        self.pending: dict[str, int] | None = None

    def start(self, publisher: Publisher | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.publisher, self.loop = publisher, loop
        self.dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="reef-learner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def describe(self) -> dict[str, Any]:
        running = self._process is not None and self._process.poll() is None
        return {"enabled": True, "params": str(self.config.params), "running": running, "rounds": self.rounds,
                "pending": self.pending, "last_round": self.last, "last_error": self.last_error}

    def _loop(self) -> None:
        while not self._stop.wait(self.config.interval_s):
            try:
                from reef.recipe.stage import Params, pending

                self.pending = pending(Params.read(self.config.params))
                if self.pending["records"] >= self.config.min_records:
                    self._round()
            except Exception as exc:  # a broken round must never take the gateway down
                log.exception("learning round failed")
                self.last_error = repr(exc)

    def _round(self) -> None:
        out = self.dir / "last-round.json"
        out.unlink(missing_ok=True)
        log_path = self.dir / "rounds.log"
        started = time.time()
        with log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "reef.learn.round", "--params", str(self.config.params),
                 "--data-dir", str(self.data_dir), "--out", str(out),
                 "--gate-samples", str(self.release.gate_samples),
                 "--gate-confidence", str(self.release.gate_confidence),
                 "--gate-min-delta", str(self.release.gate_min_delta)],
                stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            code = self._process.wait()
        if code != 0 or not out.is_file():
            self.last_error = f"round exited with code {code}; see {log_path}"
            return
        result = json.loads(out.read_text())
        self.last_error = None
        if result.get("status") == "trained":
            result["release"] = self._maybe_release(result["candidate_id"])
        entry = {"started_at": started, "seconds": round(time.time() - started, 1), **result}
        with self.rounds_file.open("a") as f:
            f.write(json.dumps(entry, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rounds += 1
        self.last = {k: entry.get(k) for k in ("status", "seconds", "metrics", "candidate_id", "release")}
        self.last["candidate"] = (entry.get("candidate") or {}).get("id")
        gate = entry.get("gate") or {}
        self.last["gate"] = {k: gate.get(k) for k in ("decision", "reason", "candidate_success", "head_success")}
        log.info("learning round: %s", self.last)

    def _maybe_release(self, candidate_id: str) -> str | None:
        """Under policy `auto`, release what the gate selected; the release id, or None."""
        if self.publisher is None or self.loop is None:
            return None
        from reef.release.candidates import find_candidate

        view = find_candidate(self.data_dir, candidate_id)
        future = asyncio.run_coroutine_threadsafe(self.publisher.auto_release(view), self.loop)
        try:
            release = future.result(timeout=600)
        except Exception as exc:  # noqa: BLE001 - a refused release is reported, the learner goes on
            self.last_error = f"auto-release of {candidate_id[:12]} failed: {exc}"
            log.warning(self.last_error)
            return None
        return release.release_id if release else None
