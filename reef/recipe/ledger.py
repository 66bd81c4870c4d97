"""The consumed ledger: which record ids a training round has used, so none is trained on twice.

Snapshots exclude every id in the ledger. Re-training on the same snapshot (another recipe
parameter, a `dvc exp run`) is allowed: those candidates are siblings built from one round, not
a second round over the same records.

Two backends, chosen here only (`open_ledger`), behind the same functions:
- files (the embedded default): one parquet file per consumed snapshot,
  `<root>/<scenario>/consumed-<hash12>.parquet` (root `data/ledger` by default), written atomically
  and durably (fsynced) once a round's training has finished. It lives apart from the experience
  folder, so that folder changes only when traffic arrives (DVC hashes it).
- PostgreSQL, when `state.url` is set (REEF_STATE__URL, which `reef serve` passes to the rounds it
  starts): one table for every learner behind every gateway (reef.recipe.ledger_pg), a round's
  records written in one transaction that refuses records another snapshot holds. `root` names
  no place then: there is one ledger per database.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from reef.core.durable import replace_atomically
from reef.core.paths import DataDir
from reef.core.pg import Database, state_url
from reef.experience import shards
from reef.recipe import ledger_pg

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


def _conflict(snapshot_hash: str, count: int, others: list[str]) -> ConsumedError:
    return ConsumedError(
        f"{count} record(s) of snapshot {snapshot_hash[:12]} were already consumed by snapshot(s) "
        f"{[h[:12] for h in others]}; take a new snapshot"
    )


class Ledger(ABC):
    @abstractmethod
    def consumed(self, scenario: str) -> pl.DataFrame:
        """Every consumed (record_id, snapshot_hash, candidate_id, consumed_at) of the scenario."""

    def check_unconsumed(self, scenario: str, snapshot_hash: str, record_ids: list[str]) -> None:
        taken = self.consumed(scenario).filter(
            pl.col("record_id").is_in(record_ids) & (pl.col("snapshot_hash") != snapshot_hash)
        )
        if taken.height:
            raise _conflict(snapshot_hash, taken.height, taken["snapshot_hash"].unique().to_list())

    @abstractmethod
    def mark_consumed(self, scenario: str, snapshot_hash: str, record_ids: list[str],
                      candidate_id: str) -> Path | None:
        """Record that a round trained on `record_ids`; idempotent per snapshot (the first round wins)."""


class FileLedger(Ledger):
    def __init__(self, root: Path | str) -> None:
        self.root = root

    def consumed(self, scenario: str) -> pl.DataFrame:
        files = sorted(ledger_dir(self.root, scenario).glob("consumed-*.parquet"))
        if not files:
            return pl.DataFrame(schema=_SCHEMA)
        return pl.read_parquet(files).select(list(_SCHEMA))

    def mark_consumed(self, scenario: str, snapshot_hash: str, record_ids: list[str],
                      candidate_id: str) -> Path | None:
        target = _path(self.root, scenario, snapshot_hash)
        if target.exists() or not record_ids:
            return target if target.exists() else None
        self.check_unconsumed(scenario, snapshot_hash, record_ids)
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


class PgLedger(Ledger):
    """One ledger for every learner on the database (reef.recipe.ledger_pg): committed before
    mark_consumed returns, so a crash after it never trains on these records again."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def consumed(self, scenario: str) -> pl.DataFrame:
        rows = ledger_pg.consumed(self.db, shards.validate_scenario(scenario))
        return pl.DataFrame(rows, schema=_SCHEMA, orient="row")

    def check_unconsumed(self, scenario: str, snapshot_hash: str, record_ids: list[str]) -> None:
        # Asked of the database (an indexed lookup), not by reading the whole ledger.
        others = ledger_pg.taken(self.db, shards.validate_scenario(scenario), snapshot_hash, record_ids)
        if others:
            count = self.consumed(scenario).filter(pl.col("record_id").is_in(record_ids)
                                                   & pl.col("snapshot_hash").is_in(others)).height
            raise _conflict(snapshot_hash, count, others)

    def mark_consumed(self, scenario: str, snapshot_hash: str, record_ids: list[str],
                      candidate_id: str) -> Path | None:
        if not record_ids:
            return None
        scenario = shards.validate_scenario(scenario)
        others = ledger_pg.mark(self.db, scenario, snapshot_hash, record_ids, candidate_id, datetime.now(UTC))
        if others:
            self.check_unconsumed(scenario, snapshot_hash, record_ids)  # raises, with the count
            raise _conflict(snapshot_hash, len(record_ids), others)
        return None


def open_ledger(root: Path | str, url: str | None = None) -> Ledger:
    """The ledger of `url` (None: REEF_STATE__URL), else the files under `root`."""
    url = state_url(url)
    return FileLedger(root) if url is None else PgLedger(ledger_pg.open_database(url))


def consumed(root: Path | str, scenario: str) -> pl.DataFrame:
    """Every consumed (record_id, snapshot_hash, candidate_id, consumed_at) of the scenario."""
    return open_ledger(root).consumed(scenario)


def check_unconsumed(root: Path | str, scenario: str, snapshot_hash: str, record_ids: list[str]) -> None:
    """Raise if another snapshot's round consumed any of `record_ids` (two snapshots taken before
    either trained); the records of this very snapshot may be trained on again."""
    open_ledger(root).check_unconsumed(scenario, snapshot_hash, record_ids)


def mark_consumed(
    root: Path | str, scenario: str, snapshot_hash: str, record_ids: list[str], candidate_id: str
) -> Path | None:
    """Record that a round trained on `record_ids`; idempotent per snapshot (the first round wins).
    Files: the ledger file written (None: no records); PostgreSQL: None."""
    return open_ledger(root).mark_consumed(scenario, snapshot_hash, record_ids, candidate_id)
