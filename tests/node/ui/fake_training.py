"""Fake training ranks for the training page's tests and screenshots: a daemon (no cluster
secret, role training, gloo) whose GPUs are the fake JSON seam with readings, and a thread that
posts each rank's reports as shoal's reporter does (POST /v1/training/reports, following the
generation the node answers), with a falling loss, a learning rate, and one slow rank.

Run it alone to look at the page (or take the docs' screenshots):
`python -m tests.node.ui.fake_training --ranks 8 --slow 5 --minutes 15`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from health.gpu_fake import FakeGpu, write_fake_gpus
from tests.cluster.cluster import free_port

ROOT = Path(__file__).resolve().parents[3]
STEP_S = 0.25
"""A fake rank's step time (the straggler's compute is SLOW_FACTOR times longer)."""
SLOW_FACTOR = 3.0
GPU_MEMORY_MB = 81559.0


def call(url: str, path: str, body: Any = None, timeout_s: float = 5.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return json.loads(answer.read())


@dataclass
class FakeRanks:
    """Posts `ranks` ranks' reports to the daemon at `url` from a thread until `stop()`;
    rank `slow` (None: none) computes SLOW_FACTOR times longer. Writes the fake GPUs' readings
    to `gpus_file` (one GPU per rank) as it goes."""

    url: str
    ranks: int
    gpus_file: Path
    slow: int | None = None
    xids: tuple[int, ...] = ()
    """The Xids GPU 0 reports from the next write of the readings (a GPU fault injected)."""
    seed: int = 7
    generation: int | None = None
    steps: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fake-ranks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        rng = random.Random(self.seed)
        started = time.time()
        while not self._stop.is_set():
            # the daemon is starting or restarting its group: the next round retries
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                self._round(rng, time.time() - started)
            self._stop.wait(STEP_S)

    def _round(self, rng: random.Random, elapsed_s: float) -> None:
        if self.generation is None:
            self.generation = call(self.url, "/v1/rendezvous").get("generation")
            if self.generation is None:
                return
        self.steps += 1
        for rank in range(self.ranks):
            compute = STEP_S * 0.8 * (SLOW_FACTOR if rank == self.slow else 1.0)
            loss = 2.2 * math.exp(-elapsed_s / 300.0) + 0.35 + 0.04 * rng.random() + 0.01 * rank
            scalars = {"loss": loss, "lr": 3e-4 * min(1.0, (elapsed_s + 1) / 120.0)}
            body = {
                "generation": self.generation,
                "rank": rank,
                "local_rank": rank,
                "world_size": self.ranks,
                "pid": 40000 + rank,
                "reports": [
                    {
                        "step": self.steps,
                        "at": time.time(),
                        "compute_s": compute * (1 + 0.05 * rng.random()),
                        "scalars": scalars,
                    }
                ],
            }
            answer = call(self.url, "/v1/training/reports", body)
            if answer["accepted"] == 0 and answer["generation"] != self.generation:
                self.generation = answer["generation"]  # a restart: the next round reports it
        if self.steps % 8 == 0:
            self._write_gpus(rng, elapsed_s)

    def _write_gpus(self, rng: random.Random, elapsed_s: float) -> None:
        gpus = []
        for rank in range(self.ranks):
            busy = 55.0 if rank == self.slow else 92.0
            util = max(0.0, min(100.0, busy + 6 * math.sin(elapsed_s / 40 + rank) + rng.random()))
            memory = GPU_MEMORY_MB * (0.55 + 0.25 * min(1.0, elapsed_s / 200.0) + 0.01 * rank)
            gpus.append(fake_gpu(rank, util, memory))
        gpus[0] = gpus[0].model_copy(update={"xids": self.xids})
        write_fake_gpus(self.gpus_file, gpus)


def fake_gpu(index: int, util_pct: float | None = None, memory_mb: float | None = None) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-5d8f0e1c-2a3b-4c5d-8e9f-{index:012x}",
        util_pct=util_pct,
        memory_used_mb=memory_mb,
        memory_total_mb=GPU_MEMORY_MB,
    )


@contextmanager
def training_daemon(root: Path, ranks: int, **settings: Any) -> Iterator[tuple[str, Path]]:
    """A `shoal serve` of role training (no secret: the dashboard is open) whose `ranks` GPUs
    are fake ones with readings; yields (its URL, the fake GPUs' file)."""
    gpus_file = root / "gpus.json"
    write_fake_gpus(gpus_file, [fake_gpu(index, 0.0, 0.0) for index in range(ranks)])
    port = free_port()
    config = root / "shoal.yaml"
    document = {
        "node_id": "gpu-host-1",
        "data_dir": str(root / "data"),
        "port": port,
        "mdns": False,
        "role": "training",
        "backend": "gloo",
        "straggler_window": 5,
        **settings,
    }
    config.write_text(yaml.safe_dump(document))
    env = {**os.environ, "SHOAL_CONFIG": str(config), "SHOAL_TEST_FAKE_GPUS": str(gpus_file)}
    log = (root / "daemon.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "node", "serve"], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if call(url, "/v1/rendezvous", timeout_s=2).get("generation") is not None:
                    break
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if process.poll() is not None:
                raise RuntimeError(f"shoal serve exited: {(root / 'daemon.log').read_text()}")
            time.sleep(0.2)
        else:
            raise RuntimeError("the daemon made no training plan within 60 s")
        yield url, gpus_file
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--slow", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--restart-at-min", type=float, default=None)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/shoal-fake-training"))
    parser.add_argument(
        "--screenshot", type=Path, default=None, help="a PNG of the page at the end"
    )
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    with training_daemon(args.dir, args.ranks) as (url, gpus_file):
        print(f"open {url}/ui/#training", flush=True)
        ranks = FakeRanks(url, args.ranks, gpus_file, slow=args.slow)
        ranks.start()
        started = time.monotonic()
        restarted = args.restart_at_min is None
        while time.monotonic() - started < args.minutes * 60:
            if not restarted and time.monotonic() - started >= args.restart_at_min * 60:
                restarted = True
                body = {"generation": ranks.generation, "reason": "worker_exit",
                        "detail": "rank 3 exited with code 1"}  # fmt: skip
                print(call(url, "/v1/training/restart", body), flush=True)
            time.sleep(1)
        if args.screenshot is not None:
            page_screenshot(f"{url}/ui/#training", args.screenshot)
        ranks.stop()


def page_screenshot(url: str, path: Path, width: int = 1280) -> None:
    """A PNG of the whole page at `url` once its plots are drawn (the docs' screenshot)."""
    from tests.node.ui.browser import chromium, until

    with chromium() as browser:
        browser.get(url)
        until(lambda: browser.execute_script("return document.querySelector('svg.plot');"), 30,
              "the plots")  # fmt: skip
        height = browser.execute_script("return document.documentElement.scrollHeight;")
        browser.set_window_size(width, int(height) + 120)
        time.sleep(1)
        browser.save_screenshot(str(path))


if __name__ == "__main__":
    main()
