"""bench/tls_bench.py, short: each `--tls-workers` count gets a daemon of its own, the large
file goes whole over plain HTTP and over TLS, the small files in batches, and the JSON carries
what docs/benchmarks.md reads (rates, the loop thread's CPU, health waits meanwhile). Rates are
printed, never asserted (tests never assert speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT_S = 300


def test_a_short_run_measures_each_worker_count_beside_plain_http() -> None:
    command = [sys.executable, "-m", "bench.tls_bench", "--size-mib", "8", "--small-files", "40"]
    command += ["--tls-workers", "0,1"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_LIMIT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert sorted(result["by_tls_workers"]) == ["0", "1"]
    for count, run in result["by_tls_workers"].items():
        for kind in ("plain", "tls"):
            large = run["large"][kind]
            assert large["bytes"] == 8 * 2**20, (count, kind)
            assert large["mib_s"] > 0
            assert large["cpu_s_server_loop_thread"] >= 0
            waits = large["health_wait_meanwhile"]
            assert (waits["answers"] == 0) is (waits["p50_ms"] is None)
            assert run["small"][kind]["files"] == 40
        assert run["large"]["tls_over_plain"] > 0
        assert run["handshakes"]["full"]["connections"] == 200
    # the daemon of count 1 terminated TLS in its worker (handshakes alone: 400 connections)
    assert result["by_tls_workers"]["0"]["tls_workers_terminated"] is None
    assert result["by_tls_workers"]["1"]["tls_workers_terminated"] >= 200
    assert result["large"] == result["by_tls_workers"]["0"]["large"]
    assert result["setup"]["size_mib"] == 8
    ratios = {k: v["large"]["tls_over_plain"] for k, v in result["by_tls_workers"].items()}
    print(json.dumps(ratios))
