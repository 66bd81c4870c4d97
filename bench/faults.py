"""Faults injected into a running Reef, under client load: what fails, what is lost, how long until
it serves again.

    .venv/bin/python bench/faults.py [--clients 4] [--seconds 10]

Rows (each with `--clients` threads sending JSON chats, each with a report, all along):
- engine kill:  `kill -9` of the managed vLLM API server of a `reef serve`
- gateway kill: `kill -9` of a `reef serve` (in front of that engine), then started again
- disk full:    the WAL on a 1 MB tmpfs (needs root or sudo) filled by large reports
For each: requests that failed, acknowledged records or reports missing afterwards (must be 0),
and the time from the fault until the first request succeeds again.
Not measured here (see the README): a learner killed mid-round and a kill during a release swap.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reef.serve_process import ServeProcess  # noqa: E402

TINY = REPO / "data" / "models" / "tiny"
MODEL = "reef-tiny"
S = "faults"
console = Console()


@dataclass
class Load:
    """Client threads: each sends a chat, then reports on it; remembers what was acknowledged."""

    url: str
    clients: int
    feedback: str = ""
    acked_records: list[str] = field(default_factory=list)
    acked_reports: list[tuple[str, str]] = field(default_factory=list)  # (report id, record id)
    failures: list[tuple[float, str]] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for i in range(self.clients):
            self._threads.append(threading.Thread(target=self._run, args=(i,), daemon=True))
            self._threads[-1].start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _run(self, worker: int) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=60, headers={"x-reef-scenario": S}) as http:
            while not self._stop.is_set():
                n += 1
                try:
                    r = http.post("/v1/chat/completions", json={
                        "model": MODEL, "max_tokens": 8,
                        "messages": [{"role": "user", "content": f"What is {worker} + {n % 10}?"}]})
                    if r.status_code != 200:
                        self._fail(f"chat {r.status_code}")
                        continue
                    record_id = r.headers["x-reef-agent-record-id"]
                    self.acked_records.append(record_id)
                    report_id = f"rep-{worker}-{n}-{time.monotonic_ns()}"
                    r = http.post("/reef/report", json={"agent_record_id": record_id, "score": 1.0,
                                                        "report_id": report_id, "feedback": self.feedback})
                    if r.status_code != 200:
                        self._fail(f"report {r.status_code}")
                        continue
                    self.acked_reports.append((report_id, record_id))
                    self.successes.append(time.monotonic())
                except httpx.HTTPError as exc:
                    self._fail(type(exc).__name__)
                    time.sleep(0.05)

    def _fail(self, what: str) -> None:
        self.failures.append((time.monotonic(), what))
        time.sleep(0.05)

    def recovered_after(self, fault_at: float, timeout_s: float = 600) -> float | None:
        """Seconds from the fault to the first success after the last failure following it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            failed = [t for t, _ in self.failures if t >= fault_at]
            if failed:
                after = [t for t in self.successes if t > failed[-1]]
                if after and time.monotonic() - after[0] > 2.0:  # and it stays up for 2 s
                    return after[0] - fault_at
            time.sleep(0.2)
        return None


def lost(url: str, load: Load) -> int:
    """Acknowledged records or reports the server does not have (a report is checked by sending
    it again: a stored one comes back as a duplicate)."""
    missing = 0
    with httpx.Client(base_url=url, timeout=60, headers={"x-reef-scenario": S}) as http:
        for record_id in load.acked_records:
            missing += http.get(f"/reef/records/{record_id}").status_code != 200
        for report_id, record_id in load.acked_reports:
            r = http.post("/reef/report", json={"agent_record_id": record_id, "score": 1.0, "report_id": report_id,
                                                 "feedback": load.feedback})
            missing += not (r.status_code == 200 and r.json().get("duplicate"))
    return missing


def row(name: str, load: Load, fault_at: float, recovered: float | None, url: str) -> list[str]:
    failed = len([t for t, _ in load.failures if t >= fault_at])
    kinds = sorted({what for t, what in load.failures if t >= fault_at})
    return [name, f"{failed} ({', '.join(kinds) or '-'})", str(lost(url, load)),
            f"{recovered:.1f} s" if recovered is not None else "never"]


def engine_kill(serve: ServeProcess, clients: int, seconds: float) -> list[str]:
    with Load(serve.url, clients) as load:
        time.sleep(seconds)
        pid = httpx.get(f"{serve.url}/reef/status").json()["engine"]["pid"]
        fault_at = time.monotonic()
        os.kill(pid, 9)
        recovered = load.recovered_after(fault_at)
        time.sleep(seconds)
    return row("engine kill (kill -9 vLLM API server)", load, fault_at, recovered, serve.url)


def gateway_kill(engine_url: str, work: Path, clients: int, seconds: float) -> list[str]:
    gw = ServeProcess(work / "gateway", ["--upstream-url", engine_url, "--model", str(TINY)],
                      env={"REEF_SERVED_MODEL_NAME": MODEL, "REEF_STORE__FLUSH_INTERVAL_S": "3600"}).start()
    try:
        with Load(gw.url, clients) as load:
            time.sleep(seconds)
            fault_at = time.monotonic()
            gw.kill()
            gw.start()
            recovered = load.recovered_after(fault_at)
            time.sleep(seconds)
        return row("gateway kill (kill -9 reef serve, restart)", load, fault_at, recovered, gw.url)
    finally:
        gw.stop()


def disk_full(engine_url: str, work: Path, clients: int, seconds: float) -> list[str]:
    gw = ServeProcess(work / "full", ["--upstream-url", engine_url, "--model", str(TINY)],
                      env={"REEF_SERVED_MODEL_NAME": MODEL, "REEF_STORE__FLUSH_INTERVAL_S": "5"})
    wal = gw.data_dir / "wal"
    wal.mkdir(parents=True)
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    subprocess.run([*sudo, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(wal)], check=True)
    try:
        gw.start()
        with Load(gw.url, clients, feedback="x" * 30_000) as load:  # ~30 reports fill the WAL's megabyte
            fault_at = time.monotonic()
            recovered = load.recovered_after(fault_at)
            time.sleep(seconds)
        return row("disk full (WAL on a 1 MB tmpfs)", load, fault_at, recovered, gw.url)
    finally:
        gw.stop()
        subprocess.run([*sudo, "umount", "-l", str(wal)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="of load before and after each fault")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="reef-faults-") as tmp:
        work = Path(tmp)
        serve = ServeProcess(work / "managed", ["--model", str(TINY)], env={"REEF_SERVED_MODEL_NAME": MODEL}).start()
        try:
            console.print("engine kill ...")
            rows.append(engine_kill(serve, args.clients, args.seconds))
            engine_url = httpx.get(f"{serve.url}/reef/status").json()["engine"]["url"]
            console.print("gateway kill ...")
            rows.append(gateway_kill(engine_url, work, args.clients, args.seconds))
            console.print("disk full ...")
            rows.append(disk_full(engine_url, work, args.clients, args.seconds))
        finally:
            serve.stop()
    table = Table(title=f"faults under load ({args.clients} clients, chat + report each)")
    for col in ("fault injected", "requests failed", "acknowledged lost", "time to recover"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    console.print(table)


if __name__ == "__main__":
    main()
