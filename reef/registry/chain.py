"""A scenario's release chain: append-only, fsynced, never forked.

    <root>/<scenario>/chain.jsonl   one Release per line, seq 0, 1, 2, ... each the parent of the next
    <root>/<scenario>/HEAD          the head release id as text ("demo@r3\\n"), read by reef.experience.load
    <root>/<scenario>/LOCK          flock'ed by whoever publishes

The head moves only by compare-and-swap: `publish(expected_parent=...)` takes the lock, checks the
chain's last release is `expected_parent` and appends, else raises HeadMovedError (HTTP 409). Two
publishers that both saw r3 can therefore never both add an r4.

The chain is the source of truth and HEAD a cache of its last line: a publish is committed once its
line is fsynced; a crash before HEAD is replaced is repaired when the chain is next opened or
published to. A torn last line (never acknowledged: publish returns only after the fsync) is cut
off; a bad line anywhere else is corruption and stops everything.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reef.core.clock import utcnow
from reef.core.durable import append_line, fsync_path, replace_atomically
from reef.core.paths import DataDir
from reef.registry.artifacts import ArtifactStore
from reef.registry.schema import (
    ArtifactKind,
    Lineage,
    Operation,
    Release,
    Routing,
    release_name,
    validate_scenario,
)

log = logging.getLogger(__name__)

DEFAULT_ROOT = DataDir().releases()
CHAIN_FILE = "chain.jsonl"
HEAD_FILE = "HEAD"
LOCK_FILE = "LOCK"


class ReleaseError(RuntimeError):
    pass


class HeadMovedError(ReleaseError):
    """The head is not the release the publisher based its change on (a concurrent or stale
    publisher): nothing was written. The API answers 409."""

    def __init__(self, scenario: str, expected: str | None, actual: str | None) -> None:
        self.scenario = scenario
        self.expected = expected
        self.actual = actual
        super().__init__(f"{scenario}: head is {actual}, not the expected {expected}")


class ReleaseNotFoundError(ReleaseError, LookupError):
    pass


class ChainCorruptError(ReleaseError):
    pass


class NotSelectedError(ReleaseError):
    """The candidate has no `select` decision from the gate (or was rejected, or is released)."""


class StaleGateError(NotSelectedError):
    """The gate compared the candidate with content that no longer serves: gate it again."""


# flock excludes other processes; threads of this one are serialized first, so they never depend on
# how flock treats two descriptors of one process (and wait on a cheap in-process lock instead).
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(directory: Path) -> threading.Lock:
    key = os.path.realpath(directory)
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(key, threading.Lock())


class ReleaseChain:
    def __init__(
        self, root: Path | str, scenario: str, *, artifacts: ArtifactStore | None = None, fsync: bool = True
    ) -> None:
        self.scenario = validate_scenario(scenario)
        self.dir = Path(root) / scenario
        self.chain_path = self.dir / CHAIN_FILE
        self.head_path = self.dir / HEAD_FILE
        # When given, a publish must name content that is in the store, with the kind it has there.
        self.artifacts = artifacts
        self.fsync = fsync
        self.dir.mkdir(parents=True, exist_ok=True)
        self._thread_lock = _thread_lock(self.dir)
        self._cache: tuple[tuple[int, int, int], list[Release]] | None = None
        with self._locked():
            self._recover()

    @classmethod
    def for_data_dir(cls, data_dir: Path | str, scenario: str, **kw: Any) -> ReleaseChain:
        return cls(DataDir(data_dir).releases(), scenario, **kw)

    # --- reading (no lock: appends are whole lines, HEAD is replaced atomically) ----------------

    def releases(self) -> list[Release]:
        # The server reads the chain on every swap and API call: parse it again only when it changed
        # (an append changes its size; a repair truncates it).
        try:
            st = self.chain_path.stat()
        except FileNotFoundError:
            return []
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._read(repair=False))
        return list(self._cache[1])

    def head(self) -> Release | None:
        releases = self.releases()
        return releases[-1] if releases else None

    def get(self, release_id: str) -> Release:
        for release in self.releases():
            if release.release_id == release_id:
                return release
        raise ReleaseNotFoundError(f"no release {release_id} in {self.chain_path}")

    def lineage(self, release_id: str) -> list[Release]:
        """`release_id` and its ancestors, newest first, ending at r0."""
        by_id = {r.release_id: r for r in self.releases()}
        if release_id not in by_id:
            raise ReleaseNotFoundError(f"no release {release_id} in {self.chain_path}")
        out = [by_id[release_id]]
        while out[-1].parent_release_id is not None:
            out.append(by_id[out[-1].parent_release_id])  # _read checked every parent exists
        return out

    # --- publishing --------------------------------------------------------------------------

    def publish(
        self,
        expected_parent: str | None,
        content_id: str,
        kind: ArtifactKind,
        operation: Operation,
        evaluation: dict[str, Any] | None = None,
        approved_by: str | None = None,
        lineage: Lineage | None = None,
        harness_id: str | None = None,
        harness_lineage: Lineage | None = None,
        routing: Routing | None = None,
    ) -> Release:
        """Append a release serving `content_id` (with harness `harness_id`, traffic split by
        `routing`) if the head is still `expected_parent` (None: the chain is empty);
        HeadMovedError otherwise. Returns once the release is durable."""
        if operation == "rollback":
            raise ValueError("publish a rollback with rollback(), which takes the content from the chain")
        fields = dict(content_id=content_id, kind=kind, operation=operation, evaluation=evaluation,
                      approved_by=approved_by, lineage=lineage, harness_id=harness_id,
                      harness_lineage=harness_lineage, routing=routing)
        return self._commit(expected_parent, lambda _: fields)

    def rollback(
        self, release_id: str, expected_parent: str, approved_by: str, evaluation: dict[str, Any] | None = None
    ) -> Release:
        """Serve `release_id`'s content (weights, harness and traffic split) again, as a new release on
        top of the head."""

        def build(releases: list[Release]) -> dict[str, Any]:
            target = next((r for r in releases if r.release_id == release_id), None)
            if target is None:
                raise ReleaseNotFoundError(f"no release {release_id} in {self.chain_path}")
            if target.traffic() == releases[-1].traffic():
                raise ReleaseError(f"{releases[-1].release_id} already serves {release_id}'s content")
            return dict(content_id=target.content_id, kind=target.kind, operation="rollback",
                        evaluation=evaluation, approved_by=approved_by, lineage=target.lineage,
                        restores=target.release_id, harness_id=target.harness_id,
                        harness_lineage=target.harness_lineage, routing=target.routing)

        return self._commit(expected_parent, build)

    def ensure_base(
        self, content_id: str, lineage: Lineage | None = None, kind: ArtifactKind = "full"
    ) -> Release:
        """Release 0 (the base model), created if the chain is empty; the existing r0 if it serves
        the same content. A different base is refused: the chain already says what r0 was."""
        try:
            self.publish(None, content_id, kind, "create", lineage=lineage)
        except HeadMovedError:
            pass  # r0 exists (maybe a concurrent ensure_base made it): check it is this base
        r0 = self.releases()[0]
        if r0.content_id != content_id:
            raise ReleaseError(f"{r0.release_id} serves content {r0.content_id}, not {content_id}")
        return r0

    def _commit(self, expected_parent: str | None, build: Callable[[list[Release]], dict[str, Any]]) -> Release:
        with self._locked():
            releases = self._recover()
            actual = releases[-1].release_id if releases else None
            if actual != expected_parent:
                raise HeadMovedError(self.scenario, expected_parent, actual)
            fields = build(releases)
            seq = len(releases)
            if (fields["operation"] == "create") != (seq == 0):
                raise ValueError(f"operation 'create' makes r0 and only r0 (next is r{seq}, "
                                 f"operation {fields['operation']!r})")
            if self.artifacts is not None:
                manifest = self.artifacts.get(fields["content_id"])  # ArtifactNotFoundError if absent
                if manifest.kind != fields["kind"]:
                    raise ValueError(f"content {fields['content_id']} is a {manifest.kind} artifact, "
                                     f"not {fields['kind']}")
                if fields.get("harness_id") and self.artifacts.get(fields["harness_id"]).kind != "harness":
                    raise ValueError(f"content {fields['harness_id']} is not a harness artifact")
                split = fields["routing"].arm("candidate") if fields.get("routing") else None
                if split is not None and self.artifacts.get(split.content_id).kind != split.kind:
                    raise ValueError(f"canary content {split.content_id} is not a {split.kind} artifact")
            release = Release(release_id=release_name(self.scenario, seq), scenario=self.scenario, seq=seq,
                              parent_release_id=actual, created_at=utcnow(), **fields)
            self._append(release)
            self._write_head(release.release_id)
            return release

    # --- files -------------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
                yield
            finally:
                os.close(fd)

    def _append(self, release: Release) -> None:
        append_line(self.chain_path, release.model_dump_json().encode() + b"\n", fsync=self.fsync)  # the commit point

    def _write_head(self, release_id: str) -> None:
        replace_atomically(self.head_path, f"{release_id}\n".encode(), fsync=self.fsync)

    def _read(self, *, repair: bool) -> list[Release]:
        """The chain's releases. A bad last line is an unacknowledged append: skipped, and with
        `repair` (only under the lock, where no append can be in flight) cut off the file."""
        try:
            data = self.chain_path.read_bytes()
        except FileNotFoundError:
            return []
        releases: list[Release] = []
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            end = len(data) if nl == -1 else nl
            try:
                release = None if nl == -1 else Release.model_validate_json(data[pos:end])
            except ValidationError:
                release = None
            if release is None:
                if end + 1 < len(data):  # a complete line follows: not a torn tail
                    raise ChainCorruptError(f"{self.chain_path}: unreadable release at byte {pos}")
                if repair:
                    log.warning("%s: torn last release at byte %d of %d, truncating", self.chain_path, pos, len(data))
                    with open(self.chain_path, "r+b") as f:
                        f.truncate(pos)
                        if self.fsync:
                            os.fsync(f.fileno())
                break
            self._check_link(release, releases)
            releases.append(release)
            pos = end + 1
        return releases

    def _check_link(self, release: Release, before: list[Release]) -> None:
        seq = len(before)
        parent = before[-1].release_id if before else None
        if (release.scenario, release.seq, release.release_id, release.parent_release_id) != (
            self.scenario, seq, release_name(self.scenario, seq), parent
        ):
            raise ChainCorruptError(f"{self.chain_path}: line {seq + 1} is {release.release_id} with parent "
                                    f"{release.parent_release_id}, expected {release_name(self.scenario, seq)} "
                                    f"with parent {parent}")

    def _recover(self) -> list[Release]:
        """Under the lock: cut a torn tail, make HEAD name the last release, drop stale temp files."""
        releases = self._read(repair=True)
        want = releases[-1].release_id if releases else None
        try:
            have: str | None = self.head_path.read_text().strip()
        except FileNotFoundError:
            have = None
        if have != want:
            log.warning("%s: HEAD says %s but the chain ends at %s; repairing HEAD", self.dir, have, want)
            if want is None:
                self.head_path.unlink()
                if self.fsync:
                    fsync_path(self.dir)
            else:
                self._write_head(want)
        for stale in self.dir.glob(f".{HEAD_FILE}.*.tmp"):
            stale.unlink(missing_ok=True)
        return releases
