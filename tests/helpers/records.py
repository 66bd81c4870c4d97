"""Records and reports to append to an experience store, and a store config that flushes only when told."""

from __future__ import annotations

from reef.config import StoreConfig
from reef.core.clock import utcnow
from reef.experience.schema import Choice, Message, Record, Report

# The background flusher stays out of the way unless a test wants it.
MANUAL = StoreConfig(fsync=True, flush_interval_s=3600, flush_max_records=10**9)


def make_record(i: int, scenario: str = "demo", release: str = "demo@r1", **kw: object) -> Record:
    # Logprobs exactly representable in float32, so a round trip through parquet compares equal.
    choice = Choice(index=0, content=f"answer {i}", finish_reason="stop", token_ids=[i, i + 1, 7],
                    logprobs=[-0.5, -0.25, -1.0])
    fields: dict[str, object] = dict(
        record_id=f"rec_{i:05d}", scenario=scenario, session_id=f"sess_{i % 3}", created_at=utcnow(),
        request_model="tiny", response_model="tiny", release_id=release,
        messages=[Message(role="user", content=f"question {i}")], choices=[choice],
        finish_reasons=["stop"], prompt_token_ids=[1, 2, 3], content_hash=f"content_{i}", body_hash=f"body_{i}",
        request_json="{}", response_json="{}", tags=[{"name": "k", "value": "v"}],
    )
    fields.update(kw)
    return Record.model_validate(fields)


def make_report(report_id: str, record_ids: list[str], score: float, scenario: str = "demo",
                **kw: object) -> Report:
    fields: dict[str, object] = dict(report_id=report_id, scenario=scenario, record_ids=record_ids, score=score,
                                     created_at=utcnow(), content_hash=f"hash_{report_id}")
    fields.update(kw)
    return Report.model_validate(fields)
