"""The release chain on real files and on a real PostgreSQL (the two backends of
reef.registry.chain_api.Chain pass the same tests): compare-and-swap under threads and processes,
rollback as a new release, crash recovery (files), and a HEAD file reef.experience.load can read."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reef.registry import (
    ArtifactNotFoundError,
    ArtifactStore,
    ChainCorruptError,
    HeadMovedError,
    Lineage,
    ReleaseChain,
    ReleaseError,
    Routing,
)
from reef.registry.chain_api import Chain
from reef.registry.chain_pg import PgChain
from reef.registry.state import open_chain
from tests.helpers.postgres import postgres  # noqa: F401 - the session's server, started by the first PG test

pytestmark = pytest.mark.model_free

# Spawned, not forked: pytest's process has threads, and forking one copies locks mid-use.
SPAWN = multiprocessing.get_context("spawn")


def cid(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


@dataclass(frozen=True)
class At:
    """Where a test's chains live: files under `root`, or PostgreSQL at `url` (HEAD cached under
    `root` as a gateway does). Picklable: spawned publishers open their own chains from it."""

    root: Path
    url: str | None = None

    def chain(self, scenario: str = "demo", **kw: Any) -> Chain:
        if self.url is None:
            return ReleaseChain(self.root, scenario, **kw)
        return PgChain(self.url, scenario, head_file=self.root / scenario / "HEAD", **kw)


@pytest.fixture(params=["files", "postgres"])
def at(request: pytest.FixtureRequest, tmp_path: Path) -> At:
    if request.param == "files":
        return At(tmp_path)
    server = request.getfixturevalue("postgres")
    return At(tmp_path, server.create_database(f"chain_{uuid.uuid4().hex[:12]}"))


def chain_with_base(at: At, scenario: str = "demo") -> Chain:
    chain = at.chain(scenario)
    chain.ensure_base(cid("base"), Lineage(base_model="data/models/tiny"))
    return chain


def head_path(chain: Chain) -> Path:
    path = chain.head_path if isinstance(chain, ReleaseChain) else chain.head_file  # type: ignore[attr-defined]
    assert isinstance(path, Path)
    return path


def head_text(chain: Chain) -> str:
    return head_path(chain).read_text()


def stored_count(at: At) -> int:
    """Releases as stored, read without any chain object's cache."""
    if at.url is None:
        return len((at.root / "demo" / "chain.jsonl").read_bytes().splitlines())
    import psycopg

    with psycopg.connect(at.url) as conn:
        return int(conn.execute("SELECT count(*) FROM reef_releases WHERE scenario = 'demo'").fetchone()[0])


# --- compare-and-swap ------------------------------------------------------------------------


def _publish_outcome(chain: Chain, expected: str, content: str) -> tuple[str, str | None, str]:
    try:
        release = chain.publish(expected, cid(content), "lora", "train", approved_by=content)
        return ("won", release.release_id, content)
    except HeadMovedError as exc:
        return ("lost", exc.actual, content)


def _process_publisher(at: At, expected: str, content: str, ready: Any, go: Any, results: Any) -> None:
    chain = at.chain()  # opened before the start line, like a live API process
    ready.put(content)
    go.wait(30)
    results.put(_publish_outcome(chain, expected, content))


def test_fifty_concurrent_publishers_one_wins(at: At) -> None:
    chain = chain_with_base(at)
    n_procs, n_threads = 4, 46
    ready, results, go = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Event()
    procs = [SPAWN.Process(target=_process_publisher, args=(at, "demo@r0", f"p{i}", ready, go, results))
             for i in range(n_procs)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    outcomes: list[tuple[str, str | None, str]] = []

    def thread_publisher(content: str) -> None:
        own = at.chain()  # half share one chain object, half open their own
        go.wait(30)
        outcomes.append(_publish_outcome(own if int(content[1:]) % 2 else chain, "demo@r0", content))

    threads = [threading.Thread(target=thread_publisher, args=(f"t{i}",)) for i in range(n_threads)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(30)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    outcomes += [results.get(timeout=5) for _ in procs]

    assert len(outcomes) == 50
    winners = [o for o in outcomes if o[0] == "won"]
    assert len(winners) == 1 and winners[0][1] == "demo@r1"
    # Every loser was refused against the winner's release: nobody slipped in before or after it.
    assert all(o[1] == "demo@r1" for o in outcomes if o[0] == "lost")
    releases = chain.releases()
    assert [r.release_id for r in releases] == ["demo@r0", "demo@r1"]
    assert releases[1].content_id == cid(winners[0][2]) and releases[1].parent_release_id == "demo@r0"
    assert head_text(chain) == "demo@r1\n"
    assert stored_count(at) == 2


def _retrying_publisher(at: At, worker: int, n: int, go: Any = None) -> None:
    chain = at.chain()
    if go is not None:
        go.wait(30)
    for k in range(n):
        while True:  # optimistic: re-read the head, try again
            head = chain.head()
            assert head is not None
            try:
                chain.publish(head.release_id, cid(f"{worker}-{k}"), "full", "train")
                break
            except HeadMovedError:
                continue


def assert_linear(at: At, contents: list[str]) -> None:
    releases = at.chain().releases()
    assert [r.seq for r in releases] == list(range(len(contents) + 1))
    assert all(r.parent_release_id == p.release_id for p, r in zip(releases, releases[1:], strict=False))
    assert sorted(r.content_id for r in releases[1:]) == sorted(cid(c) for c in contents)
    assert (at.root / "demo" / "HEAD").read_text() == f"demo@r{len(contents)}\n"


def test_retrying_publishers_make_one_linear_chain(at: At) -> None:
    chain_with_base(at)
    threads = [threading.Thread(target=_retrying_publisher, args=(at, w, 5)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert_linear(at, [f"{w}-{k}" for w in range(8) for k in range(5)])


def test_retrying_processes_make_one_linear_chain(at: At) -> None:
    # Only flock (files) or the head row's lock (PostgreSQL) stands between processes: this is the
    # test that fails without it.
    chain_with_base(at)
    go = SPAWN.Event()
    procs = [SPAWN.Process(target=_retrying_publisher, args=(at, w, 10, go)) for w in range(3)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert_linear(at, [f"{w}-{k}" for w in range(3) for k in range(10)])


def test_publish_rules(at: At) -> None:
    chain = at.chain()
    assert chain.head() is None and chain.releases() == [] and not head_path(chain).exists()
    with pytest.raises(ValueError, match="create"):
        chain.publish(None, cid("a"), "full", "train")
    r0 = chain.ensure_base(cid("base"))
    assert (r0.release_id, r0.seq, r0.parent_release_id, r0.operation) == ("demo@r0", 0, None, "create")
    assert chain.ensure_base(cid("base")) == r0 and len(chain.releases()) == 1  # idempotent
    with pytest.raises(ReleaseError, match="serves content"):
        chain.ensure_base(cid("another base"))
    with pytest.raises(ValueError, match="create"):
        chain.publish("demo@r0", cid("a"), "full", "create")
    with pytest.raises(ValueError, match="rollback"):
        chain.publish("demo@r0", cid("a"), "full", "rollback")
    with pytest.raises(HeadMovedError) as err:
        chain.publish(None, cid("a"), "full", "train")  # a publisher that thinks the chain is empty
    assert (err.value.expected, err.value.actual) == (None, "demo@r0")
    r1 = chain.publish("demo@r0", cid("a"), "lora", "train", evaluation={"delta": 0.1}, approved_by="gate")
    assert (r1.seq, r1.parent_release_id, r1.evaluation, r1.approved_by) == (1, "demo@r0", {"delta": 0.1}, "gate")
    with pytest.raises(HeadMovedError, match="head is demo@r1, not the expected demo@r0"):
        chain.publish("demo@r0", cid("b"), "lora", "train")  # stale
    assert chain.get("demo@r1") == r1 and len(chain.releases()) == 2


def test_publish_checks_the_artifact_store(at: At) -> None:
    tmp_path = at.root
    store = ArtifactStore(tmp_path / "artifacts")
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "system.md").write_text("Be terse.")
    harness = store.import_harness(tmp_path / "h")
    chain = At(tmp_path / "releases", at.url).chain(artifacts=store)
    with pytest.raises(ArtifactNotFoundError):
        chain.ensure_base(cid("not imported"))
    with pytest.raises(ValueError, match="harness artifact, not full"):
        chain.ensure_base(harness.content_id, kind="full")
    assert chain.ensure_base(harness.content_id, kind="harness").kind == "harness"


# --- rollback and lineage --------------------------------------------------------------------


def test_rollback_is_a_new_release(at: At) -> None:
    chain = chain_with_base(at)
    r1 = chain.publish("demo@r0", cid("B"), "lora", "train", lineage=Lineage(recipe="sft", snapshot_id="s1"))
    chain.publish("demo@r1", cid("C"), "full", "promote")
    history = at.chain().releases()
    with pytest.raises(HeadMovedError):
        chain.rollback("demo@r1", expected_parent="demo@r1", approved_by="ops")
    with pytest.raises(ReleaseError, match="already serves"):
        chain.rollback("demo@r2", expected_parent="demo@r2", approved_by="ops")
    r3 = chain.rollback("demo@r1", expected_parent="demo@r2", approved_by="ops")
    assert (r3.release_id, r3.operation, r3.parent_release_id, r3.restores) == ("demo@r3", "rollback", "demo@r2",
                                                                                "demo@r1")
    assert (r3.content_id, r3.kind, r3.lineage, r3.approved_by) == (r1.content_id, "lora", r1.lineage, "ops")
    assert at.chain().releases()[:3] == history  # history is never rewritten
    assert [r.release_id for r in chain.lineage("demo@r3")] == ["demo@r3", "demo@r2", "demo@r1", "demo@r0"]
    assert [r.release_id for r in chain.lineage("demo@r1")] == ["demo@r1", "demo@r0"]
    r4 = chain.rollback("demo@r0", expected_parent="demo@r3", approved_by="ops")
    assert r4.content_id == cid("base") and head_text(chain) == "demo@r4\n"


def test_routing_release_splits_traffic_and_a_rollback_restores_the_split(at: At) -> None:
    """A canary split is a routing release: the head's content plus a candidate arm; a rollback to it
    restores the split, and the next release (promote or route) ends it."""
    chain = chain_with_base(at)
    r1 = chain.publish("demo@r0", cid("B"), "lora", "train", harness_id=cid("H"))
    routing = Routing.canary("demo", r1.content_id, r1.kind, cid("C"), 0.25)
    assert [(a.arm, a.share, a.label) for a in routing.arms] == [
        ("head", 0.75, None), ("candidate", 0.25, f"demo@canary-{cid('C')[:12]}")]
    r2 = chain.publish("demo@r1", r1.content_id, r1.kind, "route", harness_id=r1.harness_id, routing=routing)
    assert r2.serves() == r1.serves() and r2.split() is not None and r2.split().content_id == cid("C")
    with pytest.raises(ValueError, match="head arm"):  # the head arm is the release's own content
        chain.publish("demo@r2", cid("X"), "lora", "route", routing=routing)
    r3 = chain.publish("demo@r2", r1.content_id, r1.kind, "route", harness_id=r1.harness_id)  # the canary ends
    assert r3.split() is None
    with pytest.raises(ReleaseError, match="already serves"):
        chain.rollback("demo@r1", expected_parent="demo@r3", approved_by="ops")  # same content, no split
    r4 = chain.rollback("demo@r2", expected_parent="demo@r3", approved_by="ops")
    assert (r4.routing, r4.restores, r4.harness_id) == (routing, "demo@r2", cid("H"))
    reread = at.chain().get("demo@r4")  # durable as JSON, read back the same
    assert reread.routing == routing
    with pytest.raises(ValueError, match="sum to 1"):
        Routing(arms=[a.model_copy(update={"share": 0.5}) if a.arm == "head" else a for a in routing.arms])


# --- crash safety ----------------------------------------------------------------------------


def _die_before_head(root: str) -> None:
    chain = ReleaseChain(root, "demo")
    chain._write_head = lambda release_id: os._exit(3)  # type: ignore[method-assign]
    chain.publish("demo@r0", cid("B"), "full", "train")


def test_crash_between_append_and_head(tmp_path: Path) -> None:
    chain_with_base(At(tmp_path))
    proc = SPAWN.Process(target=_die_before_head, args=(str(tmp_path),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 3
    assert (tmp_path / "demo" / "HEAD").read_text() == "demo@r0\n"  # the process died before HEAD moved
    chain = ReleaseChain(tmp_path, "demo")  # opening repairs HEAD from the chain, the truth
    assert head_text(chain) == "demo@r1\n" and chain.head().content_id == cid("B")  # type: ignore[union-attr]
    with pytest.raises(HeadMovedError):
        chain.publish("demo@r0", cid("C"), "full", "train")


@pytest.mark.parametrize("tail", [b'{"release_id": "demo@r2", "scen', b"\x00\x00\x00\x00\n", b"{}\n"])
def test_torn_last_line_is_cut(tmp_path: Path, tail: bytes) -> None:
    chain = chain_with_base(At(tmp_path))
    chain.publish("demo@r0", cid("B"), "full", "train")
    good = chain.chain_path.read_bytes()
    with chain.chain_path.open("ab") as f:
        f.write(tail)
    assert [r.seq for r in chain.releases()] == [0, 1]  # readers skip it without touching the file
    assert chain.chain_path.read_bytes() == good + tail
    reopened = ReleaseChain(tmp_path, "demo")
    assert reopened.chain_path.read_bytes() == good
    r2 = reopened.publish("demo@r1", cid("C"), "full", "train")
    assert r2.release_id == "demo@r2" and [r.seq for r in reopened.releases()] == [0, 1, 2]


def test_stale_or_missing_head_is_repaired(tmp_path: Path) -> None:
    chain = chain_with_base(At(tmp_path))
    chain.publish("demo@r0", cid("B"), "full", "train")
    chain.head_path.write_text("demo@r0\n")
    (chain.dir / ".HEAD.deadbeef.tmp").write_text("demo@r9")  # left by a crash mid-replace
    ReleaseChain(tmp_path, "demo")
    assert head_text(chain) == "demo@r1\n" and not list(chain.dir.glob(".HEAD.*"))
    chain.head_path.unlink()
    chain.publish("demo@r1", cid("C"), "full", "train")  # a publish repairs too, under its lock
    assert head_text(chain) == "demo@r2\n"


def test_corruption_inside_the_chain_stops_everything(tmp_path: Path) -> None:
    chain = chain_with_base(At(tmp_path))
    chain.publish("demo@r0", cid("B"), "full", "train")
    chain.publish("demo@r1", cid("C"), "full", "train")
    lines = chain.chain_path.read_bytes().splitlines(keepends=True)
    chain.chain_path.write_bytes(lines[0] + b"garbage\n" + lines[2])
    with pytest.raises(ChainCorruptError, match="unreadable"):
        ReleaseChain(tmp_path, "demo")
    chain.chain_path.write_bytes(lines[0] + lines[2])  # a line missing: r2's parent is not its predecessor
    with pytest.raises(ChainCorruptError, match="expected demo@r1"):
        ReleaseChain(tmp_path, "demo")


# --- what other readers of the releases folder expect ----------------------------------------


def test_head_file_drives_experience_staleness(at: At) -> None:
    # Imported here: reef.experience pulls in datasets and polars, which spawned publishers need not.
    from reef.experience import ExperienceStore, load, shards
    from reef.experience.load import read_head_seq, release_seq
    from reef.registry.schema import SCENARIO_RE
    from tests.helpers.records import MANUAL, make_record

    tmp_path = at.root
    assert SCENARIO_RE.pattern == shards.SCENARIO_RE.pattern  # the chain lives where load() looks
    with ExperienceStore(tmp_path, MANUAL) as store:
        store.append_records_sync([make_record(i, release="demo@r0") for i in range(3)])
    chain = open_chain(tmp_path, "demo", at.url)  # as a gateway opens it, with or without state.url
    chain.ensure_base(cid("base"))
    assert read_head_seq(tmp_path, "demo") == 0
    chain.publish("demo@r0", cid("B"), "lora", "train")
    chain.publish("demo@r1", cid("C"), "lora", "train")
    assert head_path(chain) == tmp_path / "releases" / "demo" / "HEAD"
    assert release_seq(head_text(chain)) == 2 and read_head_seq(tmp_path, "demo") == 2
    exp = load("demo", tmp_path)
    assert exp.head_seq == 2
    assert exp.collect()["staleness"].to_list() == [2, 2, 2]


def test_readers_never_see_a_partial_chain(at: At) -> None:
    chain = chain_with_base(at)
    stop = threading.Event()
    seen: queue.Queue[list[int]] = queue.Queue()

    def reader() -> None:
        other = at.chain()
        while not stop.is_set():
            seen.put([r.seq for r in other.releases()])

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(30):
            chain.publish(f"demo@r{i}", cid(str(i)), "full", "train")
    finally:
        stop.set()
        t.join(10)
    reads = [seen.get() for _ in range(seen.qsize())]
    assert reads and all(seqs == list(range(len(seqs))) for seqs in reads)
    assert len(chain.releases()) == 31
