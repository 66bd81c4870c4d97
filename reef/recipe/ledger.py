"""The consumed ledger: which record ids a training round has used, so none is trained on twice.

One parquet file per consumed snapshot, `<root>/<scenario>/consumed-<hash12>.parquet` (root
`data/ledger` by default), written atomically and durably (fsynced) once a round's training has finished. It lives
apart from the experience folder, so that folder changes only when traffic arrives (DVC hashes
it). Snapshots exclude every id in the ledger. Re-training on the same snapshot (another recipe
parameter, a `dvc exp run`) is allowed: those candidates are siblings built from one round, not
a second round over the same records.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from reef.core.durable import replace_atomically
from reef.core.paths import DataDir
from reef.experience import shards

DEFAULT_ROOT = DataDir().ledger
_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "record_id": pl.String,
    "snapshot_hash": pl.String,
    "candidate_id": pl.String,
    "consumed_at": pl.Datetime("us", "UTC"),
}


class ConsumedError(RuntimeError):
    """A snapshot holds records that another snapshot's training already consumed."""


def ledger_dir(root: Path | str, scenario: str) -> Path:
    return Path(root) / shards.validate_scenario(scenario)


def _path(root: Path | str, scenario: str, snapshot_hash: str) -> Path:
    return ledger_dir(root, scenario) / f"consumed-{snapshot_hash[:12]}.parquet"


def consumed(root: Path | str, scenario: str) -> pl.DataFrame:
    """Every consumed (record_id, snapshot_hash, candidate_id, consumed_at) of the scenario."""
    files = sorted(ledger_dir(root, scenario).glob("consumed-*.parquet"))
    if not files:
        return pl.DataFrame(schema=_SCHEMA)
    return pl.read_parquet(files).select(list(_SCHEMA))


def check_unconsumed(root: Path | str, scenario: str, snapshot_hash: str, record_ids: list[str]) -> None:
    """Raise if another snapshot's round consumed any of `record_ids` (two snapshots taken before
    either trained); the records of this very snapshot may be trained on again."""
    taken = consumed(root, scenario).filter(
        pl.col("record_id").is_in(record_ids) & (pl.col("snapshot_hash") != snapshot_hash)
    )
    if taken.height:
        other = taken["snapshot_hash"].unique().to_list()
        raise ConsumedError(
            f"{taken.height} record(s) of snapshot {snapshot_hash[:12]} were already consumed by snapshot(s) "
            f"{[h[:12] for h in other]}; take a new snapshot"
        )


def mark_consumed(
    root: Path | str, scenario: str, snapshot_hash: str, record_ids: list[str], candidate_id: str
) -> Path | None:
    """Record that a round trained on `record_ids`; idempotent per snapshot (the first round wins)."""
    target = _path(root, scenario, snapshot_hash)
    if target.exists() or not record_ids:
        return target if target.exists() else None
    check_unconsumed(root, scenario, snapshot_hash, record_ids)
    target.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    frame = pl.DataFrame(
        {
            "record_id": record_ids,
            "snapshot_hash": [snapshot_hash] * len(record_ids),
            "candidate_id": [candidate_id] * len(record_ids),
            "consumed_at": [now] * len(record_ids),
        },
        schema=_SCHEMA,
    )
    # Synced, renamed into place and its folder synced before this returns: a round that trained on
    # these records is never forgotten by a crash (which would train on them twice).
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    replace_atomically(target, buffer.getvalue())
    return target
