"""Reef's client contract: the request headers it reads and the one it answers with."""

from __future__ import annotations

import os
import re

from fastapi import Request

from reef.gateway.errors import ReefError
from reef.release.schema import SCENARIO_RE

RECORD_ID = "x-reef-agent-record-id"
SCENARIO = "x-reef-scenario"
SESSION = "x-reef-session"
TAG_PREFIX = "x-reef-tag-"
REPLAYED = "x-reef-replayed"
ERROR_SOURCE = "x-reef-error-source"
RELEASE_ID = "x-reef-release-id"  # the release whose weights and harness answered

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def new_id(prefix: str) -> str:
    # 128 random bits in 32 hex digits, as uuid4().hex gives, at a tenth of its cost (two per chat call).
    return f"{prefix}_{os.urandom(16).hex()}"


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
