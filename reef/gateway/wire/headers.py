"""Reef's client contract: the request headers it reads and the one it answers with."""

from __future__ import annotations

import os
import re
import threading

from fastapi import Request

from reef.gateway.wire.errors import ReefError
from reef.registry.schema import SCENARIO_RE

RECORD_ID = "x-reef-agent-record-id"
SCENARIO = "x-reef-scenario"
SESSION = "x-reef-session"
TAG_PREFIX = "x-reef-tag-"
REPLAYED = "x-reef-replayed"
ERROR_SOURCE = "x-reef-error-source"
RELEASE_ID = "x-reef-release-id"  # the release whose weights and harness answered
CAPTURE = "x-reef-capture"  # "false": serve the call, record nothing
CAPTURED = "x-reef-captured"  # answered "false" on a call that was not recorded

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class _RandomIds:
    """128 random bits per id (32 hex digits, as uuid4().hex gives), from one `os.urandom` read per
    256 ids: each read releases the GIL, and on a loaded gateway handing it to the store's threads
    twice per chat call cost more than the read itself."""

    _BYTES = 16
    _READ = 256 * _BYTES

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked child must not repeat our ids

    def _reset(self) -> None:
        self._lock = threading.Lock()  # new in a child: another thread may have held it at the fork
        self._pool = b""
        self._pos = 0

    def take(self) -> str:
        with self._lock:
            if self._pos == len(self._pool):
                self._pool, self._pos = os.urandom(self._READ), 0
            start = self._pos
            self._pos += self._BYTES
            return self._pool[start:self._pos].hex()


_ids = _RandomIds()


def new_id(prefix: str) -> str:
    return f"{prefix}_{_ids.take()}"


def scenario_of(request: Request) -> str:
    scenario = request.headers.get(SCENARIO, "default")
    # fullmatch: `$` alone would let a trailing newline through.
    if not SCENARIO_RE.fullmatch(scenario):
        raise ReefError(400, f"{SCENARIO} must match {SCENARIO_RE.pattern}", param=SCENARIO)
    return scenario


def valid_id(value: str, param: str) -> str:
    if not ID_RE.fullmatch(value):
        raise ReefError(400, f"{param} must match {ID_RE.pattern}", param=param)
    return value


_TAG = TAG_PREFIX.encode()


def tags_of(request: Request) -> dict[str, str]:
    # From the raw (already lower-cased) ASGI header list: `headers.items()` decodes every header
    # of every chat call to find the few, usually none, that are tags.
    return {k[len(_TAG):].decode("latin-1"): v.decode("latin-1")
            for k, v in request.scope["headers"] if k.startswith(_TAG)}


def capture_of(request: Request) -> bool:
    value = request.headers.get(CAPTURE)
    if value is None:
        return True
    if value.lower() not in ("true", "false"):
        raise ReefError(400, f"{CAPTURE} must be true or false", param=CAPTURE)
    return value.lower() == "true"
