"""Reports' idempotency keys: a report id names one report, however often and through whichever
gateway the client sends it. The same id with the same content is answered as the first time (a
replay); with other content it is a conflict (409, reef.gateway.routes.reports).

    keys = open_report_keys(store, url)       url None: files (this gateway's experience store)
    known = await keys.find(report_id)        a report stored before, or None
    async with keys.claim(report_id, scenario, content_hash, record_ids, wait_s) as known:
        if known is None:                      the id is this call's: store the report in the block
            await store.append_report(...)

Two backends, chosen here only: the experience store's own index (files, the embedded default: one
gateway per data dir, so the reports in flight in this process are all there are), or PostgreSQL at
serve.yaml's `state.url` (reef.experience.report_keys_pg: several gateways, one set of keys).
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, suppress
from dataclasses import dataclass

from reef.core.pg import Database, is_lock_timeout, state_url
from reef.experience import report_keys_pg
from reef.experience.store import ExperienceStore

# Where claims are entered (each may wait up to report_wait_s for another gateway's); at most one per
# report id at a time in this process (_Turns).
_CLAIMING = ThreadPoolExecutor(max_workers=32, thread_name_prefix="reef-report-claim")


@dataclass(frozen=True, slots=True)
class KnownReport:
    """A stored report, as a retry of it is judged and answered."""

    scenario: str
    content_hash: str
    record_ids: list[str]


class ReportKeyBusyError(RuntimeError):
    """Another call (another gateway's, maybe) is storing a report with this id and did not finish in
    time: the client retries (HTTP 503)."""


class ReportKeys(ABC):
    @abstractmethod
    async def find(self, report_id: str) -> KnownReport | None:
        """The report stored under `report_id`, or None."""

    @abstractmethod
    def claim(self, report_id: str, scenario: str, content_hash: str, record_ids: list[str],
              wait_s: float) -> AbstractAsyncContextManager[KnownReport | None]:
        """None: the id is this call's until the block ends, which stores the report durably (an
        exception gives the id back). A KnownReport: stored by another call, maybe a concurrent one
        this waited for (at most `wait_s`)."""


class _Turns:
    """Claims in this process, by report id: a concurrent retry waits for the first one's outcome (at
    most `wait_s`) instead of racing it. Event loop thread only."""

    def __init__(self) -> None:
        self._claimed: dict[str, asyncio.Future[None]] = {}

    @asynccontextmanager
    async def turn(self, report_id: str, wait_s: float) -> AsyncIterator[None]:
        pending = self._claimed.get(report_id)
        if pending is not None:
            with suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pending), wait_s)
        done = self._claimed[report_id] = asyncio.get_running_loop().create_future()
        try:
            yield
        finally:
            if self._claimed.get(report_id) is done:
                del self._claimed[report_id]
            done.set_result(None)


class StoreReportKeys(ReportKeys):
    """Files: the experience store indexes every report id it holds; a claim is held in this process."""

    def __init__(self, store: ExperienceStore) -> None:
        self.store = store
        self._turns = _Turns()

    async def find(self, report_id: str) -> KnownReport | None:
        where = self.store.report_index(report_id)
        if where is None:
            return None
        stored = await asyncio.to_thread(self.store.get_report, report_id)  # maybe a parquet read
        return KnownReport(where[0], where[1], stored.record_ids if stored else [])

    @asynccontextmanager
    async def claim(self, report_id: str, scenario: str, content_hash: str, record_ids: list[str],
                    wait_s: float) -> AsyncIterator[KnownReport | None]:
        async with self._turns.turn(report_id, wait_s):
            yield await self.find(report_id)


class PgReportKeys(ReportKeys):
    """PostgreSQL: one table of keys for every gateway (reef.experience.report_keys_pg). Reports
    stored before `state.url` was set are still found in this gateway's store."""

    def __init__(self, db: Database, store: ExperienceStore | None = None) -> None:
        self.db = db
        self.local = StoreReportKeys(store) if store is not None else None
        self._turns = _Turns()

    async def find(self, report_id: str) -> KnownReport | None:
        row = await asyncio.to_thread(report_keys_pg.find, self.db, report_id)
        if row is not None:
            return KnownReport(*row)
        return await self.local.find(report_id) if self.local is not None else None

    @asynccontextmanager
    async def claim(self, report_id: str, scenario: str, content_hash: str, record_ids: list[str],
                    wait_s: float) -> AsyncIterator[KnownReport | None]:
        async with self._turns.turn(report_id, wait_s):
            async with self._claim(report_id, scenario, content_hash, record_ids, wait_s) as known:
                yield known

    @asynccontextmanager
    async def _claim(self, report_id: str, scenario: str, content_hash: str, record_ids: list[str],
                     wait_s: float) -> AsyncIterator[KnownReport | None]:
        # The transaction spans the caller's block: entered and left on worker threads (psycopg's
        # calls block), the block itself runs on the event loop. Those threads always finish, so
        # the transaction always ends, even when the request is cancelled meanwhile. Entering may
        # wait for another gateway's claim: on threads of its own, so that no commit, which frees
        # such a wait, ever queues behind the waits.
        held = report_keys_pg.claim(self.db, report_id, scenario, content_hash, record_ids, wait_s)
        entering = asyncio.get_running_loop().run_in_executor(_CLAIMING, held.__enter__)
        try:
            row = await asyncio.shield(entering)
        except asyncio.CancelledError:
            entering.add_done_callback(lambda done: _give_back(held) if done.exception() is None else None)
            raise
        except Exception as exc:
            if is_lock_timeout(exc):
                raise ReportKeyBusyError(f"report {report_id} is being stored by another call; retry") from exc
            raise
        try:
            yield None if row is None else KnownReport(*row)
        except BaseException as exc:
            await asyncio.to_thread(held.__exit__, type(exc), exc, exc.__traceback__)
            raise
        await asyncio.to_thread(held.__exit__, None, None, None)


def _give_back(held: AbstractContextManager[object]) -> None:
    """Roll back a claim whose caller was cancelled while it was being made (on a worker thread)."""

    def rollback() -> None:
        with suppress(BaseException):  # the rolled-back claim re-raises what it was given
            held.__exit__(asyncio.CancelledError, asyncio.CancelledError(), None)

    threading.Thread(target=rollback, name="reef-report-key-rollback", daemon=True).start()


def open_report_keys(store: ExperienceStore, url: str | None = None) -> ReportKeys:
    """The keys of `url`'s backend (None: REEF_STATE__URL, else the store's files)."""
    url = state_url(url)
    if url is None:
        return StoreReportKeys(store)
    return PgReportKeys(report_keys_pg.open_database(url), store)
