"""Faults injected into a running Reef, under client load: what fails, what is lost, how long until
it serves again.

    .venv/bin/python bench/faults.py [--clients 4] [--seconds 10]

Rows (each with `--clients` threads sending JSON chats, each with a report, all along):
- engine kill:  `kill -9` of the managed vLLM API server of a `reef serve`
- replica kill: `kill -9` of one of the two vLLM API servers of a `reef serve` with `engine.replicas: 2`
                (target: 0 failed requests); recovery is the time until the killed replica serves
                again (restarted by its supervisor, brought in step with the releases)
- gateway kill: `kill -9` of a `reef serve` (in front of that engine), then started again
- gateway kill, second alive: two `reef serve` on one PostgreSQL (`state.url`, a server `initdb`ed
                for the row) and one shared data dir, each its own `store.partition`, in front of a
                stand-in engine, with half the clients each; every 4th report of a client goes
                through the other gateway (retried while that one answers 404 record_not_found:
                the record not flushed yet). `kill -9` of one, started again (same partition) under
                the load. Failed requests are counted on the survivor (target: 0); acknowledged
                records and reports are looked up in the union of both partitions
                (`reef.experience.load` over the shared data dir) once both are stopped
- disk full:    the WAL on a 1 MB tmpfs (needs root or sudo) filled by large reports
- learner kill: `kill -9` of a `reef serve` with the learner on while a round trains, then started
                again; also: records trained twice (ledger) and records of the killed round that
                are neither in a candidate nor pending (both must be 0)
- kill during swap: `kill -9` of a `reef serve` while it publishes a full-weight release (crash
                points `release:loaded`, before the chain append, and `release:appended`, right
                after), then started again; also: whether the head and what answers agree
For each: requests that failed, acknowledged records or reports missing afterwards (must be 0),
and the time from the fault until the first request succeeds again.

    .venv/bin/python bench/faults.py --rows learner,swap    # only some rows

The 1M test model and the scenarios its corpus taught (demo-add, demo-rules) come from the tests'
helpers (tests/helpers/tiny; `make test` builds data/models/tiny, or `python -m tests.helpers.tiny.model`).
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
import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.engine.supervisor import free_port  # noqa: E402
from reef.serve_process import ServeProcess  # noqa: E402
from tests.helpers import replica_stand_in  # noqa: E402
from tests.helpers.postgres import PostgresServer  # noqa: E402
from tests.helpers.tiny import declare_scenarios  # noqa: E402

declare_scenarios()  # demo-add and demo-rules, here and in the processes this bench starts

TINY = REPO / "data" / "models" / "tiny"
MODEL = "reef-tiny"
S = "faults"
console = Console()


@dataclass
class _Cross:
    """A report a client sends through the other gateway: due when, first sent when, retried."""

    body: dict
    due: float = 0.0
    first: float = 0.0
    retried: bool = False


@dataclass
class Load:
    """Client threads: each sends a chat, then reports on it; remembers what was acknowledged.

    With `other` (a second gateway on the same data dir), every `cross_every`-th report of a client
    goes through `other` instead, while the client goes on: a 404 `record_not_found` there (the record
    not flushed by the gateway that recorded it yet) is retried, as the scale-out page tells clients
    to, for up to `CROSS_WAIT_S`."""

    url: str
    clients: int
    feedback: str = ""
    scenario: str = S
    other: str | None = None
    cross_every: int = 0
    acked_records: list[str] = field(default_factory=list)
    acked_reports: list[tuple[str, str]] = field(default_factory=list)  # (report id, record id)
    failures: list[tuple[float, str, str]] = field(default_factory=list)  # (when, what, the gateway's url)
    successes: list[float] = field(default_factory=list)
    cross_sent: int = 0  # reports sent through `other`
    cross_acked: int = 0  # of those, acknowledged
    cross_waits: list[float] = field(default_factory=list)  # of those first answered 404: seconds until found
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
            t.join(timeout=CROSS_WAIT_S + 60)

    def failed_since(self, at: float, url: str | None = None) -> list[str]:
        """What failed from `at` on (at `url` only, when given)."""
        return [what for t, what, where in self.failures if t >= at and url in (None, where)]

    def _run(self, worker: int) -> None:
        n = 0
        pending: list[_Cross] = []  # reports to go through `other`
        with httpx.Client(base_url=self.url, timeout=60, headers={"x-reef-scenario": self.scenario}) as http:
            while not self._stop.is_set():
                n += 1
                try:
                    self._chat_and_report(http, worker, n, pending)
                except httpx.HTTPError as exc:
                    self._fail(type(exc).__name__, self.url)
                self._send_cross(http, pending)
            while pending:  # stopped: what is still to go through the other gateway
                time.sleep(CROSS_RETRY_S)
                self._send_cross(http, pending)

    def _chat_and_report(self, http: httpx.Client, worker: int, n: int, pending: list[_Cross]) -> None:
        question = f"What is {worker} + {n % 10}?"
        r = http.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": question}]})
        if r.status_code != 200:
            self._fail(f"chat {r.status_code}", self.url)
            return
        record_id = r.headers["x-reef-agent-record-id"]
        self.acked_records.append(record_id)
        report_id = f"rep-{worker}-{n}-{time.monotonic_ns()}"
        body = {"agent_record_id": record_id, "score": 1.0, "report_id": report_id, "feedback": self.feedback}
        if self.other is not None and self.cross_every and n % self.cross_every == 0:
            pending.append(_Cross(body))  # sent after this, without waiting on it
            self.cross_sent += 1
        else:
            r = http.post("/reef/report", json=body)
            if r.status_code != 200:
                self._fail(f"report {r.status_code}", self.url)
                return
            self.acked_reports.append((report_id, record_id))
        self.successes.append(time.monotonic())

    def _send_cross(self, http: httpx.Client, pending: list[_Cross]) -> None:
        """Send each pending report that is due through `other`; one answered 404 record_not_found
        (not flushed by the gateway that recorded it yet) is tried again `CROSS_RETRY_S` later, for
        up to `CROSS_WAIT_S`, while the client goes on with its chats."""
        now = time.monotonic()
        for cross in [c for c in pending if c.due <= now]:
            pending.remove(cross)
            cross.first = cross.first or now
            try:
                r = http.post(f"{self.other}/reef/report", json=cross.body)
            except httpx.HTTPError as exc:
                self._fail(type(exc).__name__, str(self.other))
                continue
            if (r.status_code == 404 and r.json()["error"].get("code") == "record_not_found"
                    and now - cross.first < CROSS_WAIT_S):
                cross.retried, cross.due = True, now + CROSS_RETRY_S
                pending.append(cross)
            elif r.status_code != 200:
                self._fail(f"report {r.status_code}", str(self.other))
            else:
                self.acked_reports.append((cross.body["report_id"], cross.body["agent_record_id"]))
                self.cross_acked += 1
                if cross.retried:
                    self.cross_waits.append(time.monotonic() - cross.first)

    def _fail(self, what: str, url: str) -> None:
        self.failures.append((time.monotonic(), what, url))
        time.sleep(0.05)

    def recovered_after(self, fault_at: float, timeout_s: float = 600) -> float | None:
        """Seconds from the fault to the first success after the last failure following it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            failed = [t for t, _, _ in self.failures if t >= fault_at]
            if failed:
                after = [t for t in self.successes if t > failed[-1]]
                if after and time.monotonic() - after[0] > 2.0:  # and it stays up for 2 s
                    return after[0] - fault_at
            time.sleep(0.2)
        return None


def lost(url: str, load: Load, records_url: str | None = None) -> int:
    """Acknowledged records or reports the server does not have (a report is checked by sending
    it again: a stored one comes back as a duplicate). Records are looked up at `records_url`
    (default: `url`), the gateway that recorded them."""
    missing = 0
    with httpx.Client(base_url=url, timeout=60, headers={"x-reef-scenario": load.scenario}) as http:
        for record_id in load.acked_records:
            missing += http.get(f"{records_url or url}/reef/records/{record_id}").status_code != 200
        for report_id, record_id in load.acked_reports:
            r = http.post("/reef/report", json={"agent_record_id": record_id, "score": 1.0, "report_id": report_id,
                                                 "feedback": load.feedback})
            missing += not (r.status_code == 200 and r.json().get("duplicate"))
    return missing


def row(name: str, load: Load, fault_at: float, recovered: float | None, url: str, lost_note: str = "",
        recover_note: str = "") -> list[str]:
    failed = load.failed_since(fault_at)
    kinds = sorted(set(failed))
    return [name, f"{len(failed)} ({', '.join(kinds) or '-'})", f"{lost(url, load)}{lost_note}",
            (f"{recovered:.1f} s" if recovered is not None else "never") + recover_note]


def wait_for(what: str, until, timeout_s: float = 900.0) -> float:  # noqa: ANN001
    """Wait until `until()` is true; the monotonic time it became so."""
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            raise RuntimeError(f"never happened: {what}")
        time.sleep(0.2)
    return time.monotonic()


def engine_kill(serve: ServeProcess, clients: int, seconds: float) -> list[str]:
    with Load(serve.url, clients) as load:
        time.sleep(seconds)
        pid = httpx.get(f"{serve.url}/reef/status").json()["engine"]["pid"]
        fault_at = time.monotonic()
        os.kill(pid, 9)
        recovered = load.recovered_after(fault_at)
        time.sleep(seconds)
    return row("engine kill (kill -9 vLLM API server)", load, fault_at, recovered, serve.url)


def replica_kill(work: Path, clients: int, seconds: float) -> list[str]:
    gw = ServeProcess(work / "replicas", ["--model", str(TINY)],
                      env={"REEF_SERVED_MODEL_NAME": MODEL, "REEF_ENGINE__REPLICAS": "2"}).start()
    try:
        def engine() -> dict:
            return httpx.get(f"{gw.url}/reef/status", timeout=30).json()["engine"]

        with Load(gw.url, clients) as load:
            time.sleep(seconds)
            victim = engine()["engines"][1]
            fault_at = time.monotonic()
            os.kill(victim["pid"], 9)

            def serving_again() -> bool:
                now = engine()
                return (now["engines"][1]["restarts"] > victim["restarts"] and now["engines"][1]["ready"]
                        and now["replicas"][1]["healthy"])

            back = wait_for("the killed replica serving again", serving_again) - fault_at
            time.sleep(seconds)
        served = [r["requests"] for r in engine()["replicas"]]
        return row("replica kill (kill -9 one of 2 vLLM API servers)", load, fault_at, back, gw.url,
                   recover_note=f" (requests per replica: {served[0]}, {served[1]})")
    finally:
        gw.stop()


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


CROSS_EVERY = 4  # in the gateways row, each client's every 4th report goes through the other gateway
CROSS_WAIT_S = 60.0  # how long a client retries a report the other gateway answers 404 record_not_found
CROSS_RETRY_S = 0.2  # and how often


def gateways_kill(work: Path, clients: int, seconds: float) -> list[str]:
    """Two gateways on one PostgreSQL and one data dir, each its own `store.partition`, `kill -9` of
    one under load, then started again (same partition) while the load goes on (see the module's
    docstring). Half the clients send their chats to each gateway; every `CROSS_EVERY`-th report of a
    client goes through the other one (no sticky sessions: the shared data dir is what lets that
    gateway find the record). What was acknowledged is counted afterwards in the union of both
    partitions, as every reader sees it (`reef.experience.load` over the shared data dir)."""
    from reef.experience import load as load_experience
    from reef.experience import shards

    port = free_port()
    engine = replica_stand_in.start(port, "engine")
    try:
        with PostgresServer.start() as pg:
            # Flushed each second: a report through the other gateway waits for the record's shard.
            env = {"REEF_SERVED_MODEL_NAME": MODEL, "REEF_STATE__URL": pg.create_database("faults"),
                   "REEF_STORE__FLUSH_INTERVAL_S": "1"}
            # The gateways never load the model (the stand-in answers): a folder they can hash as r0.
            model = work / "stand-in-model"
            model.mkdir()
            (model / "config.json").write_text('{"model_type": "llama"}')
            (model / "model.safetensors").write_bytes(os.urandom(2048))
            args = ["--upstream-url", f"http://127.0.0.1:{port}", "--model", str(model)]
            data = work / "gateways-data"  # shared
            gateways = []
            for name in ("a", "b"):
                gw = ServeProcess(work / f"gateway-{name}", args, {**env, "REEF_STORE__PARTITION": name})
                gw.data_dir, gw.log_path = data, data / "logs" / f"reef-serve-{name}.log"
                gw.workdir.mkdir()
                gateways.append(gw)
            killed, survivor = gateways
            try:
                killed.start()
                survivor.start()
                half = max(1, clients // 2)
                with (Load(killed.url, half, other=survivor.url, cross_every=CROSS_EVERY) as on_killed,
                      Load(survivor.url, half, other=killed.url, cross_every=CROSS_EVERY) as on_survivor):
                    time.sleep(seconds)
                    fault_at = time.monotonic()
                    killed.kill()
                    time.sleep(seconds)  # the survivor alone under its load; what is sent to the other fails
                    restarted_at = time.monotonic()
                    killed.start()  # the same partition: its WAL is flushed into its shards first
                    back = time.monotonic() - restarted_at
                    time.sleep(seconds)  # both again
                first = min((t for t in on_survivor.successes if t > fault_at), default=None)
                killed.stop()  # both flush what their WAL holds
                survivor.stop()
                union = set(load_experience(S, data).collect()["record_id"])
                stored = set(shards.scan(shards.shard_glob(data, S, "reports"), "reports").collect()["report_id"])
            finally:
                killed.kill()
                survivor.kill()
    finally:
        engine.kill()
        engine.wait()
    loads = (on_killed, on_survivor)
    records = {r for load in loads for r in load.acked_records}
    reports = {rep for load in loads for rep, _ in load.acked_reports}
    failed = [what for load in loads for what in load.failed_since(fault_at, survivor.url)]
    on_dead = sum(len(load.failed_since(fault_at, killed.url)) for load in loads)
    on_restarted = sum(len(load.failed_since(restarted_at + back, killed.url)) for load in loads)
    waits = [w for load in loads for w in load.cross_waits]
    cross = (f"; {sum(load.cross_acked for load in loads)} of the {len(reports)} acknowledged reports went through "
             f"the other gateway (each client's every {CROSS_EVERY}th report, "
             f"{sum(load.cross_sent for load in loads)} sent), {len(waits)} first answered 404 record_not_found "
             "(the record not flushed yet by the one that recorded it) and were retried"
             + (f", waiting {max(waits):.1f} s at most" if waits else ""))
    return ["gateway kill, second alive (kill -9 one of 2 reef serve on one PostgreSQL and one data dir, "
            "a store.partition each)",
            f"{len(failed)} on the survivor ({', '.join(sorted(set(failed))) or '-'}); {on_dead} sent to the killed "
            f"one ({on_restarted} of them once it was back)" + cross,
            f"{len(records - union)} of {len(records)} records, {len(reports - stored)} of {len(reports)} reports "
            "(the union of both partitions, reef.experience.load)",
            (f"survivor: first success {first - fault_at:.1f} s after the kill" if first is not None
             else "survivor: never") + f"; the killed one restarted (same partition) in {back:.1f} s"]


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


LEARN = "demo-add"  # a scenario with an eval suite, so the learner's rounds are gated


def _round(url: str) -> dict | None:
    try:
        return httpx.get(f"{url}/reef/status", timeout=10).json()["learner"]["scenarios"][LEARN]["round"]
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None


def learner_kill(engine_url: str, work: Path, clients: int, seconds: float) -> list[str]:
    from reef.experience import load as load_experience
    from reef.learn.round_log import RoundLog
    from reef.recipe import Snapshot, ledger, load_recipe
    from reef.recipe.snapshot import select

    gw = ServeProcess(work / "learner", ["--upstream-url", engine_url, "--model", str(TINY)], env={
        "REEF_SERVED_MODEL_NAME": MODEL, "REEF_STORE__FLUSH_INTERVAL_S": "0.5", "REEF_LEARNER__ENABLED": "true",
        "REEF_LEARNER__INTERVAL_S": "1", "REEF_RELEASE__GATE__SAMPLES": "1"})
    gw.workdir.mkdir(parents=True, exist_ok=True)
    params = {"kind": "lora", "max_steps": 120, "min_score": 1.0, "learning_rate": 5e-3}
    (gw.workdir / "serve.yaml").write_text(yaml.safe_dump({
        "recipes": {"lora-rft": {"recipe": "rft", "min_records": 32, "params": params}},
        "scenarios": {LEARN: {"recipe": "lora-rft"}}}))
    data = gw.data_dir
    try:
        gw.start()
        with Load(gw.url, clients, scenario=LEARN) as load:
            wait_for("a round's train step", lambda: (_round(gw.url) or {}).get("state") == "snapshotted")
            time.sleep(3)  # into the training itself (120 steps: far from done)
            killed = _round(gw.url)
            assert killed is not None and killed["state"] == "snapshotted", killed
            in_flight = set(Snapshot.open(data / "snapshots" / LEARN).record_ids)
            fault_at = time.monotonic()
            gw.kill()
            gw.start()
            recovered = load.recovered_after(fault_at)
            closed = wait_for("the killed round closed", lambda: (_round(gw.url) or {}).get("round_id")
                              != killed["round_id"] and (_round(gw.url) or {}).get("state") in FINAL)
            time.sleep(seconds)
        consumed = ledger.consumed(data / "ledger", LEARN)
        twice = consumed.height - consumed["record_id"].n_unique()
        spec = load_recipe("rft", {"base_model": str(TINY), **params, "scenario": LEARN}).experience()
        waiting, _ = select(load_experience(LEARN, data).collect(), spec, set(consumed["record_id"]))
        gone = len(in_flight - set(consumed["record_id"]) - set(waiting["record_id"]))
        ends = {r.round_id: r.state for r in RoundLog.for_data_dir(data, LEARN).rounds()}
        note = (f"; killed round ({len(in_flight)} records) {ends[killed['round_id']]}, next round "
                f"{(_round(gw.url) or {}).get('state')} at {closed - fault_at:.1f} s")
        return row("learner kill (kill -9 reef serve mid-training, restart)", load, fault_at, recovered, gw.url,
                   f" (records trained twice: {twice}, in no candidate nor pending: {gone})", note)
    finally:
        gw.stop()


FINAL = {"released", "rejected", "done", "failed", "abandoned", "gated"}  # gated: selected, policy approval


def _selected_full_candidate(data: Path) -> tuple[str, dict]:
    """A full-weight rft candidate of demo-add the gate selects, registered in `data`: (id, its probe)."""
    from reef.config import GateSettings
    from reef.gate.evaluate import evaluate_candidate
    from reef.recipe import Snapshot, load_recipe
    from reef.registry.candidates import register_candidate
    from reef.traffic.offline import record_offline_traffic

    traffic = data.parent / "traffic"
    record_offline_traffic(TINY, traffic, LEARN, prompts=64, samples=4, seed=1)
    rft = load_recipe("rft", {"scenario": LEARN, "base_model": str(TINY), "per_device_batch_size": 16,
                              "min_score": 1.0, "kind": "full", "max_steps": 30, "learning_rate": 5e-4})
    snap = Snapshot.create(LEARN, traffic, rft.experience(), root=data.parent / "snapshots",
                           ledger_root=data.parent / "ledger")
    cand = rft.run(snap, out_root=data.parent / "candidates", progress=False, consume=False)
    view = register_candidate(data, cand.path)
    result = evaluate_candidate(data, view.candidate_id, GateSettings(samples=2), progress=False)
    if result.decision != "select" or result.probe is None:
        raise RuntimeError(f"the gate did not select the bench's candidate: {result.reason}")
    return view.candidate_id, result.probe.model_dump()


def _base_reply(probe: dict) -> str:
    """What the base model answers to the probe at temperature 0 (transformers, fp32, as the gate)."""
    from reef.sampling.load import load_model
    from reef.sampling.transformers import TransformersSampler

    model, tokenizer = load_model(TINY)
    return TransformersSampler(model, tokenizer).sample([probe["messages"]], 1, max_new_tokens=probe["max_tokens"],
                                                        temperature=0.0, seed=0)[0][0].text


def swap_kill(engine_url: str, work: Path, clients: int, seconds: float) -> list[list[str]]:
    gw = ServeProcess(work / "swap", ["--upstream-url", engine_url, "--model", str(TINY)], env={
        "REEF_SERVED_MODEL_NAME": MODEL, "REEF_STORE__FLUSH_INTERVAL_S": "0.5", "REEF_ADMIN_TOKEN": "bench"})
    candidate, probe = _selected_full_candidate(gw.data_dir)
    base_text = _base_reply(probe)
    admin = {"Authorization": "Bearer bench"}
    rows = []
    try:
        for point in ("release:loaded", "release:appended"):
            gw.env["REEF_CRASH_AT"] = point
            gw.start()
            releases = f"{gw.url}/reef/scenarios/{LEARN}/releases"
            before = httpx.get(releases).json()["head"]["release_id"]
            with Load(gw.url, clients, scenario=LEARN) as load:
                time.sleep(seconds)
                fault_at = time.monotonic()
                try:
                    httpx.post(releases, headers=admin, timeout=300, json={
                        "candidate": candidate, "expected_parent": before, "approved_by": "bench"})
                except httpx.HTTPError:
                    pass
                assert gw.process is not None and gw.process.wait(timeout=120) == -9
                del gw.env["REEF_CRASH_AT"]
                gw.start()
                recovered = load.recovered_after(fault_at)
                time.sleep(seconds)
            head = httpx.get(releases).json()["head"]
            serving = httpx.get(f"{gw.url}/reef/status").json()["scenarios"][LEARN]["serving"]
            raw = httpx.post(f"{gw.url}/v1/chat/completions", headers={"x-reef-scenario": LEARN}, timeout=60, json={
                "model": MODEL, "messages": probe["messages"], "max_tokens": probe["max_tokens"], "temperature": 0})
            expected = probe["text"] if head["content_id"] == candidate else base_text
            agree = (serving["release_id"] == head["release_id"] == raw.headers["x-reef-release-id"]
                     and raw.json()["choices"][0]["message"]["content"] == expected and serving["error"] is None)
            rows.append(row(f"kill during swap (kill -9 reef serve at {point}, restart)", load, fault_at, recovered,
                            gw.url, "", f"; head {head['release_id']}, serving and answers "
                            f"{'agree' if agree else 'DISAGREE'}"))
            if head["release_id"] != before:  # the base weights back for the next row
                httpx.post(f"{gw.url}/reef/scenarios/{LEARN}/rollback", headers=admin, timeout=300,
                           json={"release_id": before, "expected_parent": head["release_id"]}).raise_for_status()
            gw.stop()
    finally:
        gw.stop()
    return rows


ROWS = "engine,replica,gateway,gateways,disk,learner,swap"
# The rows that use the managed engine started first (the others start what they need).
ON_MANAGED = {"engine", "gateway", "disk", "learner", "swap"}
# The table's order: each row's name up to " (".
ROW_ORDER = ["engine kill", "replica kill", "gateway kill", "gateway kill, second alive", "disk full", "learner kill",
             "kill during swap"]


def managed_rows(wanted: set[str], work: Path, clients: int, seconds: float) -> list[list[str]]:
    """The rows in front of one managed engine (`reef serve` on the tiny model)."""
    rows = []
    serve = ServeProcess(work / "managed", ["--model", str(TINY)], env={"REEF_SERVED_MODEL_NAME": MODEL}).start()
    try:
        if "engine" in wanted:
            console.print("engine kill ...")
            rows.append(engine_kill(serve, clients, seconds))
        engine_url = httpx.get(f"{serve.url}/reef/status").json()["engine"]["url"]
        if "gateway" in wanted:
            console.print("gateway kill ...")
            rows.append(gateway_kill(engine_url, work, clients, seconds))
        if "disk" in wanted:
            console.print("disk full ...")
            rows.append(disk_full(engine_url, work, clients, seconds))
        if "learner" in wanted:
            console.print("learner kill ...")
            rows.append(learner_kill(engine_url, work, clients, seconds))
        if "swap" in wanted:  # last: it swaps the engine's full weights (and puts the base back)
            console.print("kill during swap ...")
            rows.extend(swap_kill(engine_url, work, clients, seconds))
    finally:
        serve.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="of load before and after each fault")
    parser.add_argument("--rows", default=ROWS, help="which rows, comma-separated")
    add_flag(parser)
    args = parser.parse_args()
    wanted = set(args.rows.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="reef-faults-") as tmp:
        work = Path(tmp)
        # The rows that start their own engines first, while no managed engine takes the CPU.
        if "replica" in wanted:
            console.print("replica kill ...")
            rows.append(replica_kill(work, args.clients, args.seconds))
        if "gateways" in wanted:
            console.print("gateway kill, second alive ...")
            rows.append(gateways_kill(work, args.clients, args.seconds))
        if wanted & ON_MANAGED:
            rows.extend(managed_rows(wanted, work, args.clients, args.seconds))
    rows.sort(key=lambda r: ROW_ORDER.index(r[0].split(" (")[0]))
    table = Table(title=f"faults under load ({args.clients} clients, chat + report each)")
    for col in ("fault injected", "requests failed", "acknowledged lost", "time to recover"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    console.print(table)
    # A run of some rows gets a section of its own rather than replacing the whole table's.
    publish(args, "faults" if wanted >= set(ROWS.split(",")) else "faults_" + "_".join(sorted(wanted)), table)


if __name__ == "__main__":
    main()
