"""A process that appends records as fast as it can and prints each id once its append is
acknowledged (fsynced), until it is killed: what the crash tests kill -9 mid-write.

    python -m tests.helpers.crash_writer DATA_DIR [--partition P] [--concurrency N]

Small flushes, so a kill also lands between shard writes and segment deletes."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from reef.config import StoreConfig
from reef.experience.store import ExperienceStore
from tests.helpers.records import make_record


async def write(store: ExperienceStore, concurrency: int) -> None:
    async def one(i: int) -> None:
        await store.append_record(make_record(i))
        sys.stdout.write(f"rec_{i:05d}\n")
        sys.stdout.flush()

    for start in range(0, 10**6, concurrency):
        await asyncio.gather(*(one(i) for i in range(start, start + concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("--partition", default=None)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    config = StoreConfig(flush_interval_s=0.05, flush_max_records=40, partition=args.partition)
    asyncio.run(write(ExperienceStore(args.data, config).open(), args.concurrency))


if __name__ == "__main__":
    main()
