"""The one clock for timestamps written to disk: aware UTC, so every layer's times compare."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
