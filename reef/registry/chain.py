"""A scenario's release chain in files: append-only, fsynced, never forked. The embedded default
backend of `reef.registry.chain_api.Chain` (PostgreSQL's, for several gateways: reef.registry.chain_pg).

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reef.core.durable import append_line, fsync_path, replace_atomically
from reef.core.paths import DataDir
from reef.registry.artifacts import ArtifactStore
from reef.registry.chain_api import (
    Build,
    Chain,
    ChainCorruptError,
    HeadMovedError,
    NotSelectedError,
    ReleaseError,
    ReleaseNotFoundError,
    StaleGateError,
)
from reef.registry.schema import Release, validate_scenario

log = logging.getLogger(__name__)

DEFAULT_ROOT = DataDir().releases()
CHAIN_FILE = "chain.jsonl"
HEAD_FILE = "HEAD"
LOCK_FILE = "LOCK"


# Defined with the interface (reef.registry.chain_api), importable from here as before.
__all__ = ["CHAIN_FILE", "Chain", "ChainCorruptError", "HeadMovedError", "NotSelectedError", "ReleaseChain",
           "ReleaseError", "ReleaseNotFoundError", "StaleGateError"]


# flock excludes other processes; threads of this one are serialized first, so they never depend on
# how flock treats two descriptors of one process (and wait on a cheap in-process lock instead).
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(directory: Path) -> threading.Lock:
    key = os.path.realpath(directory)
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(key, threading.Lock())


class ReleaseChain(Chain):
    """The file backend of `Chain`."""

    def __init__(
        self, root: Path | str, scenario: str, *, artifacts: ArtifactStore | None = None, fsync: bool = True
    ) -> None:
        self.scenario = validate_scenario(scenario)
        self.dir = Path(root) / scenario
        self.chain_path = self.dir / CHAIN_FILE
        self.head_path = self.dir / HEAD_FILE
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

    @property
    def location(self) -> str:
        return str(self.chain_path)

    # --- publishing --------------------------------------------------------------------------

    def _commit(self, expected_parent: str | None, build: Build) -> Release:
        with self._locked():
            releases = self._recover()
            release = self._next_release(releases, expected_parent, build)
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
