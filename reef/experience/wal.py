"""Write-ahead log with group commit: an append is acknowledged only once it is on disk.

Segments are `<wal_dir>/<seq:08d>.log`; each entry is one line `<crc32 hex8> <json>\\n` with json
`{"t": "records"|"reports", "row": <row>}`. One writer thread takes everything queued since its
last write, writes it with one `write` and syncs once (O_DSYNC, or fdatasync where there is none),
then wakes every waiter of that batch: under load one sync covers hundreds of appends, which is
what makes durable appends cheap.

A full disk is not the end of the log: a write that fails with ENOSPC (or EDQUOT, EFBIG) is cut
back off the segment, its waiters get `WalFullError` (nothing of theirs is acknowledged), and the
next batch tries again, so appends succeed again once space is freed (the flusher moves segments
into parquet and deletes them). Any other failure, or a failed cut, stops the log for good.

The log knows nothing of records: it stores (table, row JSON) pairs, plus an opaque tag the
caller gets back from `rotate()` so it can drop the rows from memory once they are in parquet.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from reef.core.durable import fsync_path

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".log"


class WalEntry(NamedTuple):
    table: str
    row: bytes  # the row as JSON: model_dump(by_alias=True, mode="json"), serialized
    tag: Any = None  # the caller's, returned untouched; None for entries read back by recovery


@dataclass
class Segment:
    seq: int
    path: Path
    entries: list[WalEntry] = field(default_factory=list)


class WalError(RuntimeError):
    """The log failed or is closed: nothing more can be made durable through it."""


class WalFullError(WalError):
    """The disk holding the log is full: this append is not durable; later ones may be."""


_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def encode(entry: WalEntry) -> bytes:
    # Built by concatenation rather than orjson.dumps({...}) so the row is serialized only once.
    line = b'{"t":"' + entry.table.encode() + b'","row":' + entry.row + b"}"
    return b"%08x %s\n" % (zlib.crc32(line), line)


def decode(line: bytes) -> WalEntry | None:
    """The entry in one line (without its newline), or None if it is torn or corrupt."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    try:
        crc = int(line[:8], 16)
    except ValueError:
        return None
    payload = line[9:]
    if zlib.crc32(payload) != crc:
        return None
    try:
        obj = orjson.loads(payload)
        return WalEntry(str(obj["t"]), orjson.dumps(obj["row"]))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def segment_path(directory: Path, seq: int) -> Path:
    return directory / f"{seq:08d}{SEGMENT_SUFFIX}"


_datasync = getattr(os, "fdatasync", os.fsync)
# With O_DSYNC each write returns only once its data is durable, exactly like write + fdatasync,
# but in one syscall: the writer thread then takes the GIL back once per batch instead of twice,
# and each of those can wait up to the interpreter's switch interval (5 ms) while the event loop
# is busy serializing appends.
_O_DSYNC = getattr(os, "O_DSYNC", 0)
USE_O_DSYNC = bool(_O_DSYNC)


def read_segment(path: Path, *, truncate: bool = True) -> list[WalEntry]:
    """All intact entries of a segment. The first bad line (bad CRC or no newline: a write the
    crash interrupted, never acknowledged) ends it; with `truncate` the file is cut there so the
    next recovery sees the same, clean, segment."""
    data = path.read_bytes()
    entries: list[WalEntry] = []
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        entry = decode(data[pos:nl]) if nl != -1 else None
        if entry is None:
            log.warning("WAL %s: torn or corrupt entry at byte %d of %d, truncating", path, pos, len(data))
            if truncate:
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
            break
        entries.append(entry)
        pos = nl + 1
    return entries


class _Batch(NamedTuple):
    data: bytes
    entries: Sequence[WalEntry]
    waiter: asyncio.Future[None] | None  # None: a sync caller, which waits on the counters
    ticket: int


class WriteAheadLog:
    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.directory = directory
        self.fsync = fsync
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the writer waits here for batches
        self._done = threading.Condition(self._lock)  # sync callers wait here for durability
        self._pending: list[_Batch] = []
        self._submitted = 0  # batches ever queued ...
        self._durable = 0  # ... and how many of the first of them are on disk
        self._error: BaseException | None = None
        self._full: dict[int, BaseException] = {}  # tickets of sync callers whose batch hit a full disk
        self._closing = False
        self._writer_idle = False
        # The current segment; `_io_lock` keeps rotation from slipping between a write and its sync.
        self._io_lock = threading.Lock()
        self._segment: Segment | None = None
        self._fd = -1
        self._size = 0  # bytes of the current segment that hold whole, synced batches
        self._thread: threading.Thread | None = None
        self.writes = 0  # write+sync rounds so far: appends / writes is the group-commit factor
        self._lock_fd = -1

    # --- the folder's lock -------------------------------------------------------------------

    def try_lock(self) -> bool:
        """Take the folder's exclusive lock (`LOCK`, flock: the kernel drops it when the process
        dies); False when another holder has it. Two writers appending to one log would interleave
        segments: whoever writes or recovers it holds this first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # --- lifecycle ---------------------------------------------------------------------------

    def segments_on_disk(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SEGMENT_SUFFIX}"))

    def recover(self) -> list[Segment]:
        """The segments a previous run left behind, torn tails cut off. Call before `start`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        out = []
        for path in self.segments_on_disk():
            try:
                seq = int(path.stem)
            except ValueError:
                continue
            out.append(Segment(seq, path, read_segment(path)))
        return out

    def start(self, first_seq: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._open_segment(first_seq)
        self._thread = threading.Thread(target=self._run, name="reef-wal-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write what is queued, stop the writer; an empty current segment is removed."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._work.notify()
        if self._thread is not None:
            self._thread.join()
        with self._io_lock:
            if self._segment is not None:
                os.close(self._fd)
                if not self._segment.entries:
                    self._segment.path.unlink(missing_ok=True)
                self._segment = None

    def remove(self, segment: Segment) -> None:
        """Delete a rotated segment whose rows are now safely elsewhere."""
        segment.path.unlink(missing_ok=True)
        if self.fsync:
            fsync_path(self.directory)

    # --- appending ---------------------------------------------------------------------------

    def _submit(self, data: bytes, entries: Sequence[WalEntry], waiter: asyncio.Future[None] | None) -> int:
        with self._lock:
            if self._error is not None:
                raise WalError("the write-ahead log failed earlier") from self._error
            if self._closing or self._thread is None:
                raise WalError("the write-ahead log is not open")
            self._submitted += 1
            self._pending.append(_Batch(data, entries, waiter, self._submitted))
            # Condition.notify costs more than the rest of an append: only wake a writer that sleeps.
            if self._writer_idle:
                self._work.notify()
            return self._submitted

    async def append(self, entries: Sequence[WalEntry]) -> None:
        """Return once all `entries` are durable (written, and synced unless fsync is off)."""
        data = b"".join([encode(e) for e in entries])
        fut = asyncio.get_running_loop().create_future()
        self._submit(data, entries, fut)
        await fut

    def append_sync(self, entries: Sequence[WalEntry]) -> None:
        data = b"".join([encode(e) for e in entries])
        ticket = self._submit(data, entries, None)
        self._wait_for(ticket)

    def barrier(self) -> None:
        """Wait until everything queued before this call is durable."""
        with self._lock:
            ticket = self._submitted
        self._wait_for(ticket)

    def _wait_for(self, ticket: int) -> None:
        with self._lock:
            while self._durable < ticket and self._error is None:
                self._done.wait()
            full = self._full.pop(ticket, None)
            if full is not None:
                raise WalFullError(f"write-ahead log: the disk is full ({full})") from full
            if self._durable < ticket:
                raise WalError("the write-ahead log failed") from self._error

    # --- rotation ----------------------------------------------------------------------------

    def rotate(self) -> Segment | None:
        """Close the current segment and start the next; returns the closed one with the entries
        written to it (kept in memory, so flushing never re-reads the file), or None if it is empty."""
        with self._io_lock:
            seg = self._segment
            if seg is None or not seg.entries:
                return None
            os.close(self._fd)  # every write to it was synced before its waiters were woken
            self._segment = None
            self._open_segment(seg.seq + 1)
            return seg

    def _open_segment(self, seq: int) -> None:
        path = segment_path(self.directory, seq)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        if self.fsync and USE_O_DSYNC:
            flags |= _O_DSYNC
        self._fd = os.open(path, flags, 0o644)
        self._size = os.fstat(self._fd).st_size
        if self.fsync:
            fsync_path(self.directory)
        self._segment = Segment(seq, path)

    # --- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._writer_idle = True
                    self._work.wait()
                    self._writer_idle = False
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                upto = self._submitted
            error: BaseException | None = None
            fatal = False
            try:
                self._write(batch)
            except WalFullError as exc:  # cut back off the segment: retried with the next batch
                log.warning("WAL: %s; %d append(s) refused", exc, len(batch))
                error = exc
            except BaseException as exc:  # a failed write or sync leaves the file in an unknown state
                log.exception("WAL write failed; refusing further appends")
                error, fatal = exc, True
            with self._lock:
                if fatal:
                    self._error = error
                    # Nothing queued behind a failed write can be trusted either.
                    batch.extend(self._pending)
                    self._pending = []
                else:
                    if error is not None:
                        self._full.update({b.ticket: error for b in batch if b.waiter is None})
                    self._durable = upto
                self._done.notify_all()
            _wake(batch, error)
            if fatal:
                return

    def _write(self, batch: list[_Batch]) -> None:
        data = memoryview(b"".join([b.data for b in batch]))
        with self._io_lock:
            assert self._segment is not None
            try:
                while data:
                    written = os.write(self._fd, data)
                    data = data[written:]
                if self.fsync and not USE_O_DSYNC:
                    _datasync(self._fd)
            except OSError as exc:
                if exc.errno not in _FULL:
                    raise
                # Part of the batch may be in the file: cut it off, so the segment holds only whole,
                # acknowledged batches and the next write appends after them. If the cut fails, the
                # exception is not WalFullError and the log stops.
                os.ftruncate(self._fd, self._size)
                os.fsync(self._fd)
                raise WalFullError(f"{os.strerror(exc.errno)} writing {self._segment.path}") from exc
            self._size += sum(len(b.data) for b in batch)
            self.writes += 1
            entries = self._segment.entries
            for b in batch:
                entries.extend(b.entries)


def _wake(batch: list[_Batch], error: BaseException | None) -> None:
    # One cross-thread call per event loop and batch, not per waiter: waking a loop is a syscall.
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for b in batch:
        if b.waiter is not None:
            by_loop.setdefault(b.waiter.get_loop(), []).append(b.waiter)
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, futures, error)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for fut in futures:
        if fut.done():  # the awaiting task was cancelled; the entry is written all the same
            continue
        if error is None:
            fut.set_result(None)
        elif isinstance(error, WalFullError):
            fut.set_exception(WalFullError(str(error)))
        else:
            fut.set_exception(WalError(f"write-ahead log write failed: {error!r}"))
