"""A record-store server for tests: the record routes on 127.0.0.1, printing its port.

Usage: python tests/sync/record_server.py DATA_DIR [--node-id ID] [--max-pending N]
Prints `PORT <n>` once serving; stops on SIGTERM/SIGINT (tests also SIGKILL it).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sync import RecordStores, StoreOptions, record_routes  # noqa: E402


async def serve(data_dir: Path, node_id: str, options: StoreOptions) -> None:
    stores = RecordStores(data_dir, options=options)
    app = web.Application()
    app.add_routes(record_routes(stores, node_id))
    async with stores:
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            sys.stdout.write(f"PORT {port}\n")
            sys.stdout.flush()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--node-id", default="server")
    parser.add_argument("--max-pending", type=int, default=StoreOptions().max_pending_records)
    args = parser.parse_args()
    options = StoreOptions(max_pending_records=args.max_pending)
    asyncio.run(serve(args.data_dir, args.node_id, options))


if __name__ == "__main__":
    main()
