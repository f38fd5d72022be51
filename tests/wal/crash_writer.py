"""Writer process of the crash tests: appends from many tasks, printing `a <id> <token>` per
durable append and `c <id>` per durable commit; with --count it stops, else it runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from wal import WalConfig, WriteAheadLog

# Entry types of the caller's own (shoal writes only sync_started and sync_completed).
GAME_RECORDED = "game_recorded"


async def run(path: Path, tasks: int, count: int | None) -> None:
    config = WalConfig(max_pending=10_000_000, checkpoint_interval_s=0.05, idle_checkpoint_s=0.05)
    remaining = [count if count is not None else -1]
    pid = os.getpid()

    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async with WriteAheadLog(path, config=config) as wal:

        async def worker(worker_id: int) -> None:
            n = 0
            while remaining[0] != 0:
                remaining[0] -= 1
                token = f"{pid}-{worker_id}-{n}"
                key = token if n % 3 == 0 else None
                entry_id = await wal.append(GAME_RECORDED, {"token": token}, key=key)
                emit(f"a {entry_id} {token}")
                if n % 4 == 1:
                    await wal.commit(entry_id)
                    emit(f"c {entry_id}")
                n += 1

        await asyncio.gather(*(worker(w) for w in range(tasks)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--count", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(run(args.path, args.tasks, args.count))


if __name__ == "__main__":
    main()
