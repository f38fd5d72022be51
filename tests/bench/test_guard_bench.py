"""bench/guard_bench.py runs a guarded and a bare all_reduce on a real gloo group and reports
both, per size (a short run: the figures' shape, not their speed). It runs as a command, as a
user runs it: its rank processes (and multiprocessing's resource tracker) stay out of the
test's process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.guard_bench import SMALL_BYTES

ROOT = Path(__file__).resolve().parents[2]


def test_the_guard_bench_reports_bare_and_guarded_all_reduce_per_size() -> None:
    command = [sys.executable, "bench/guard_bench.py", "--calls", "20", "--big-mib", "0.0625"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["ranks"] == 2
    assert [row["bytes"] for row in figures["sizes"]] == [SMALL_BYTES, 1 << 16]
    for row in figures["sizes"]:
        assert row["bare_us"] > 0
        assert row["guarded_us"] > 0
        assert row["overhead_us"] == round(row["guarded_us"] - row["bare_us"], 1)


def test_the_guard_bench_refuses_a_group_of_one() -> None:
    command = [sys.executable, "bench/guard_bench.py", "--ranks", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--ranks must be at least 2" in done.stderr
