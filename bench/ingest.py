"""How fast the experience store makes records durable, and how fast it moves them to parquet.

    .venv/bin/python bench/ingest.py [--records 50000] [--concurrency 256] [--no-fsync]

Phases, each on a fresh store in a temporary folder (or under --data-dir):
  async   `concurrency` asyncio tasks each awaiting `append_record` (as the gateway does), with the
          background flusher running at its default settings; reports ack latency too.
  sync    `append_records_sync` in batches of `--batch` (tools, imports).
  flush   `flush()` of everything appended with the background flusher held off: WAL -> parquet.
Records are built before timing: building them is the gateway's cost, not the store's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.results import add_flag, publish  # noqa: E402
from reef.config import StoreConfig  # noqa: E402
from reef.core.clock import utcnow  # noqa: E402
from reef.core.hashing import sha256_json  # noqa: E402
from reef.experience.schema import Choice, Message, Record, record_content_hash  # noqa: E402
from reef.experience.store import ExperienceStore  # noqa: E402

console = Console(width=110)


def make_records(n: int, scenario: str = "bench", seed: int = 0) -> list[Record]:
    """Small, realistic chat records: system + user (+ earlier turn), one 32-token choice."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = [
            Message(role="system", content="You are a concise assistant for arithmetic questions."),
            Message(role="user", content=f"What is {rng.randint(1, 999)} + {rng.randint(1, 999)}?"),
        ]
        if i % 3 == 0:
            messages += [Message(role="assistant", content="Let me think."), Message(role="user", content="Go on.")]
        tokens = [rng.randrange(32_000) for _ in range(32)]
        choice = Choice(
            index=0, content=" ".join(str(t) for t in tokens[:8]), finish_reason="stop",
            token_ids=tokens, logprobs=[-rng.random() * 3 for _ in tokens],
        )
        body = {"model": "reef-tiny", "messages": [m.model_dump(exclude_none=True) for m in messages]}
        out.append(Record(
            record_id=f"rec_{seed}_{i:08d}", scenario=scenario, session_id=f"sess_{i % 97}",
            created_at=utcnow(), request_model="reef-tiny", response_model="reef-tiny",
            response_id=f"chatcmpl-{i}", release_id=f"{scenario}@r0", messages=messages,
            temperature=1.0, max_tokens=32, choices=[choice], finish_reasons=["stop"],
            prompt_token_ids=[rng.randrange(32_000) for _ in range(24)], input_tokens=24,
            output_tokens=32, latency_ms=40.0, content_hash=record_content_hash(scenario, messages, [choice]),
            body_hash=sha256_json([scenario, body]), request_json=str(body), response_json="{}",
        ))
    return out


async def _async_phase(store: ExperienceStore, records: list[Record], concurrency: int) -> list[float]:
    latencies: list[float] = []
    it = iter(records)

    async def worker() -> None:
        for record in it:  # a shared iterator: each record is taken by exactly one task
            t0 = time.perf_counter()
            await store.append_record(record)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


class _Clock:
    """Wall time and process CPU time (all threads) of a block."""

    def __enter__(self) -> _Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run(args: argparse.Namespace, root: Path) -> None:
    fsync = not args.no_fsync
    n = args.records
    with _Clock() as built:
        records = make_records(n)
    console.print(f"built {n:,} records in {built.wall:.2f} s "
                  f"(~{len(records[0].model_dump_json(by_alias=True)):,} bytes each as JSON)")
    # The prebuilt records are a bench artifact (a gateway holds only the unflushed ones): keep
    # the garbage collector from rescanning them all.
    gc.freeze()
    load = os.getloadavg()[0]
    console.print(f"{os.cpu_count()} CPUs, load average {load:.2f} before start"
                  + (" (other work is running: expect lower numbers)" if load > 0.5 else ""))
    results = Table(title=f"experience store ingest (fsync={'on' if fsync else 'off'}, group commit)")
    for col in ("phase", "records", "seconds", "records/s", "CPU µs/record", "WAL writes", "records/write"):
        results.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    notes: list[str] = []

    def row(phase: str, clock: _Clock, writes: int | None = None) -> None:
        results.add_row(phase, f"{n:,}", f"{clock.wall:.2f}", f"{n / clock.wall:,.0f}", f"{clock.cpu / n * 1e6:.0f}",
                        "-" if writes is None else f"{writes:,}", "-" if not writes else f"{n / writes:.0f}")

    # async: the gateway's path, flusher at its defaults
    store = ExperienceStore(root / "async", StoreConfig(fsync=fsync)).open()
    with console.status(f"async: {args.concurrency} tasks appending..."), _Clock() as clock:
        lat = asyncio.run(_async_phase(store, records, args.concurrency))
    backlog = sum(s.unflushed_records for s in store.stats().values())
    row(f"async x{args.concurrency}", clock, store._wal.writes)  # noqa: SLF001 - a bench may look inside
    with _Clock() as drain:
        store.close()  # close() flushes what the flusher had not got to yet
    lat_ms = sorted(x * 1e3 for x in lat)
    notes.append(f"async: ack latency p50 {statistics.median(lat_ms):.1f} ms, "
                 f"p99 {lat_ms[int(len(lat_ms) * 0.99)]:.1f} ms; {backlog:,} left for the flusher at the end, "
                 f"drained by close() in {drain.wall:.2f} s")

    # sync batches
    store = ExperienceStore(root / "sync", StoreConfig(fsync=fsync)).open()
    with console.status(f"sync: batches of {args.batch}..."), _Clock() as clock:
        for i in range(0, n, args.batch):
            store.append_records_sync(records[i : i + args.batch])
    row(f"sync batch {args.batch}", clock, store._wal.writes)  # noqa: SLF001
    store.close()

    # flush: WAL -> parquet shards, nothing else running
    manual = StoreConfig(fsync=fsync, flush_interval_s=3600, flush_max_records=10**9)
    store = ExperienceStore(root / "flush", manual).open()
    for i in range(0, n, args.batch):
        store.append_records_sync(records[i : i + args.batch])
    with console.status("flush..."), _Clock() as clock:
        store.flush()
    row("flush", clock)
    size = sum(p.stat().st_size for p in (root / "flush" / "experience").rglob("*.parquet"))
    notes.append(f"flush: WAL -> one parquet shard of {size / 2**20:.1f} MiB (zstd), nothing else running")
    store.close()

    with _Clock() as clock:
        store = ExperienceStore(root / "async").open()
    results.add_row("reopen", f"{store.stats()['bench'].records:,}", f"{clock.wall:.2f}", "-", "-", "-", "-")
    notes.append("reopen: open() of the async store, rebuilding the id indexes from its shards")
    store.close()

    console.print(results)
    notes.append("async and sync run with the background flusher at its defaults: its CPU counts against them")
    notes.append("CPU µs/record: process CPU time (all threads, flusher included) per record: steadier than "
                 "records/s when other work shares the cores")
    for note in notes:
        console.print(f"  {note}")
    publish(args, "ingest", results, "\n".join(f"- {note}" for note in notes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--data-dir", type=Path, help="where to write (default: a temporary folder, removed)")
    add_flag(parser)
    args = parser.parse_args()
    if args.data_dir:
        run(args, args.data_dir)
        return
    root = Path(tempfile.mkdtemp(prefix="reef-bench-"))
    try:
        run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
