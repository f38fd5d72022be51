"""bench/guard_bench.py runs a guarded and a bare all_reduce on a real gloo group and reports
both, per size (a short run: the figures' shape, not their speed)."""

from __future__ import annotations

from bench.guard_bench import SMALL_BYTES, run


def test_the_guard_bench_reports_bare_and_guarded_all_reduce_per_size() -> None:
    figures = run(ranks=2, calls=20, big_bytes=1 << 16)
    assert figures["ranks"] == 2
    assert [row["bytes"] for row in figures["sizes"]] == [SMALL_BYTES, 1 << 16]
    for row in figures["sizes"]:
        assert row["bare_us"] > 0
        assert row["guarded_us"] > 0
        assert row["overhead_us"] == round(row["guarded_us"] - row["bare_us"], 1)
