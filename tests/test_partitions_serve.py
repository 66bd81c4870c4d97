"""Acceptance (issue 26): two `reef serve` gateways on one PostgreSQL and one shared data dir, each
writing its own experience partition (`store.partition`), in front of a stand-in engine. Under load,
`kill -9` of one: the survivor fails no call, and once the killed one's partition is opened again no record
either acknowledged is missing, and `reef.experience.load` (what snapshots read) holds both's; a report through one
gateway for a record the other recorded is stored once that one flushed it, and a conversation's
turns through both are one session."""

from __future__ import annotations

import http.server
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from reef.config import StoreConfig
from reef.experience import load
from reef.experience.shards import all_shards, shard_partition
from reef.experience.store import ExperienceStore
from reef.serve_process import ServeProcess
from tests.helpers.postgres import PostgresServer, postgres  # noqa: F401 - the session's server
from tests.helpers.stand_in import StandInUpstream, fake_model

pytestmark = pytest.mark.model_free

SCENARIO = "demo"
HEADERS = {"x-reef-scenario": SCENARIO}
CHAT = {"model": "stand-in", "messages": [{"role": "user", "content": "hi"}]}


class Clients:
    """Threads sending chats to one gateway until stopped: the record ids it acknowledged, and when
    each call failed."""

    def __init__(self, url: str, threads: int = 2) -> None:
        self.url = url
        self.acked: list[str] = []
        self.failures: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                try:
                    resp = client.post(f"{self.url}/v1/chat/completions", json=CHAT, headers=HEADERS)
                    if resp.status_code == 200:
                        self.acked.append(resp.headers["x-reef-agent-record-id"])
                        continue
                except httpx.HTTPError:
                    pass
                self.failures.append(time.monotonic())
                time.sleep(0.01)

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def wait_for(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_two_gateways_one_data_dir_kill_9_of_one(tmp_path: Path, postgres: PostgresServer) -> None:  # noqa: F811
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    model = fake_model(tmp_path / "model")
    data = tmp_path / "data"  # shared
    url = postgres.create_database(f"parts_{uuid.uuid4().hex[:12]}")
    args = ["--upstream-url", f"http://127.0.0.1:{upstream.server_address[1]}", "--model", str(model)]
    gateways = {}
    for name in ("a", "b"):
        gw = ServeProcess(tmp_path / name, args, {"REEF_STATE__URL": url, "REEF_STORE__PARTITION": name,
                                                  "REEF_STORE__FLUSH_INTERVAL_S": "0.2"})
        gw.data_dir, gw.log_path = data, data / "logs" / f"reef-serve-{name}.log"
        gw.workdir.mkdir()
        gateways[name] = gw
    a, b = gateways["a"], gateways["b"]
    try:
        with ThreadPoolExecutor(2) as pool:  # at once: both import the base and open the data dir together
            list(pool.map(lambda gw: gw.start(timeout_s=120), (a, b)))
        with httpx.Client(timeout=10) as client:
            # A conversation's first turn through a, its second through b: one session, once b has
            # indexed a's shard (after a's flush: b's next flush round, or a lookup that misses).
            first = client.post(f"{a.url}/v1/chat/completions", json=CHAT, headers=HEADERS)
            first_id = first.headers["x-reef-agent-record-id"]
            wait_for(lambda: client.get(f"{b.url}/reef/records/{first_id}").status_code == 200)
            turn = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "ok"},
                                         {"role": "user", "content": "and?"}]}
            second = client.post(f"{b.url}/v1/chat/completions", json=turn, headers=HEADERS)
            session = [client.get(f"{gw.url}/reef/records/{r.headers['x-reef-agent-record-id']}")
                       .json()["gen_ai.conversation.id"] for gw, r in ((a, first), (b, second))]
            assert session[0] == session[1], session
            assert [client.get(f"{gw.url}/reef/status").json()["partition"] for gw in (a, b)] == ["a", "b"]
        with Clients(a.url) as on_a, Clients(b.url) as on_b:
            wait_for(lambda: len(on_a.acked) >= 10 and len(on_b.acked) >= 10)
            killed_at = time.monotonic()
            a.kill()
            after = len(on_b.acked)
            wait_for(lambda: len(on_b.acked) >= after + 10)  # the survivor alone, under its load
        assert not on_b.failures, f"{len(on_b.failures)} calls failed on the survivor"
        assert not [t for t in on_a.failures if t < killed_at]

        # A report through b for a record a recorded: found once a's shards hold it.
        with httpx.Client(timeout=10) as client:
            flushed = set(load(SCENARIO, data).collect()["record_id"])
            theirs = next(r for r in on_a.acked if r in flushed)
            resp = client.post(f"{b.url}/reef/report", json={"agent_record_id": theirs, "score": 1.0},
                               headers=HEADERS)
            assert resp.status_code == 200, resp.text

        b.stop()
    finally:
        for gw in (a, b):
            gw.kill()
        upstream.shutdown()

    # What a's WAL held at the kill is read once its partition is opened again: a restarted `reef
    # serve` of partition a does just this first (a gateway start costs seconds here; the open does not).
    with ExperienceStore(data, StoreConfig(partition="a")):
        pass
    frame = load(SCENARIO, data).collect()
    missing = (set(on_a.acked) | set(on_b.acked)) - set(frame["record_id"])
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
    scores = dict(zip(frame["record_id"], frame["score"], strict=True))
    assert scores[theirs] == 1.0
    assert {p[0] for f in all_shards(data, "records") if (p := shard_partition(f))} == {"a", "b"}
