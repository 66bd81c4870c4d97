"""Durable file primitives: a file is durable once fsynced, a new or renamed entry once its
directory is. Standard library only, so light processes (CLI commands, publishers) can use them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (which makes entries created or renamed in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_atomically(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Readers see the old content or the new, never a mix: write a sibling, sync it, rename."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    _write(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, data, fsync)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_path(path.parent)


def append_line(path: Path, line: bytes, *, fsync: bool = True) -> None:
    """Append one record (`line` ends with a newline) to an append-only log; durable on return.
    A crash can leave only a torn last line, which readers skip as never acknowledged."""
    created = not path.exists()
    _write(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, line, fsync)
    if created and fsync:
        fsync_path(path.parent)


def read_log(path: Path, parse: Callable[[bytes], T]) -> list[T]:
    """The entries of a log written by `append_line`, parsed; [] if it does not exist yet. A line
    that does not parse (a torn last line: never acknowledged) is skipped."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(parse(line))
        except ValueError:
            continue
    return out


def _write(path: Path, flags: int, data: bytes, fsync: bool) -> None:
    fd = os.open(path, flags, 0o644)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: Path) -> None:
    """fsync every file and folder under `root`, and `root`: the whole tree is on disk."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))


def replace_dir(staging: Path, target: Path, *, fsync: bool = True) -> None:
    """Put a fully written folder in place of `target`: readers (and a crash) see the old folder
    or the new one, whole, never neither. Linux swaps the two in one step (renameat2 with
    RENAME_EXCHANGE); elsewhere the old one is first renamed aside (a crash between the two renames
    leaves it there, whole, as `.<name>.old-*`)."""
    if fsync:
        sync_tree(staging)
    if not target.exists():
        os.rename(staging, target)
    elif _exchange(staging, target):
        if fsync:
            fsync_path(target.parent)
        shutil.rmtree(staging)  # it now holds the old folder
    else:
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
        os.rename(staging, target)
        if fsync:
            fsync_path(target.parent)
        shutil.rmtree(old, ignore_errors=True)
    if fsync:
        fsync_path(target.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths; False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))
