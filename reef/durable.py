"""Durable file primitives: a file is durable once fsynced, a new or renamed entry once its
directory is. Standard library only, so light processes (CLI commands, publishers) can use them.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


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


def _write(path: Path, flags: int, data: bytes, fsync: bool) -> None:
    fd = os.open(path, flags, 0o644)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
