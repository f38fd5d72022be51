"""What watching training costs and what it buys.

(a) `session.report()`: its cost per call (the compute time measured by the session, the report
    queued for the reporting thread) with a daemon taking the reports and without one (plain
    torchrun), and as a share of a 10 ms step: the call's CPU time plus the reporting thread's
    CPU time per step (encoding and posting the batches) over a loop of 10 ms steps with a
    report after each. Costs are CPU times of the threads involved (the training thread's for
    one call, the reporting thread's from its own clock), so a loaded machine does not inflate
    them. Target: below 1% of the step.
(b) fault to the group's next step, on three daemons (separate processes on 127.0.0.1,
    `training_nproc: 2`, gloo, the cluster tests' shoal.training_session script): a worker
    SIGSTOPped (a hang: the group restarts after the hang timeout) and a worker SIGKILLed (a
    worker exit: the whole group restarts at once). The time runs from the signal to the first
    step every rank of the new generation finished (the workers' own timestamps).
    An injected Xid needs the GPU quarantine's test seam, which is not on this branch: skipped.
Prints JSON. Bounded (about 4 minutes with the defaults); every process is stopped at the end.
Usage: .venv/bin/python bench/training_bench.py [--repeats 3] [--hang-s 5] [--no-cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shoal.group import torch_modules  # noqa: E402
from shoal.rendezvous import rendezvous_from_env  # noqa: E402
from shoal.session import TrainingSession  # noqa: E402
from tests.cluster.cluster import LoopbackCluster, free_port  # noqa: E402
from tests.cluster.waiting import wait_until  # noqa: E402
from tests.node.test_training_cluster import TrainingCluster  # noqa: E402

STEP_S = 0.010
CALLS = 20_000
LOOP_STEPS = 300
TARGET_SHARE = 0.01


def _per_call_ns(session: TrainingSession) -> float:
    """The median over 5 rounds of the mean CPU cost of one report() in a tight loop."""
    rounds = []
    for _ in range(5):
        started = time.thread_time_ns()
        for step in range(CALLS // 5):
            session.report(step, loss=0.5)
        rounds.append((time.thread_time_ns() - started) / (CALLS // 5))
    return statistics.median(rounds)


def _background_ns_per_step(session: TrainingSession, steps: int) -> float:
    """The reporting thread's CPU nanoseconds per step over `steps` steps of STEP_S, each
    followed by a report, the last batch posted."""
    reporter = session._reporter
    thread = reporter._thread
    assert thread is not None
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    session.report(0)
    time.sleep(1.0)  # what the tight loop queued is posted before this loop starts
    started = time.clock_gettime_ns(clock)
    for step in range(steps):
        time.sleep(STEP_S)
        session.report(step, loss=0.5)
    time.sleep(1.0)
    return (time.clock_gettime_ns(clock) - started) / steps


def _session(env: dict[str, str]) -> TrainingSession:
    rendezvous = rendezvous_from_env(env)
    assert rendezvous is not None
    from shoal._daemon import DaemonClient

    client = DaemonClient.from_env(env) if env.get("SHOAL_DAEMON_URL") else None
    return TrainingSession(rendezvous, client)


def report_cost(daemon_url: str | None) -> dict[str, Any]:
    """(a): one session of a world of one, reporting to `daemon_url` (None: no daemon)."""
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "SHOAL_BACKEND": "gloo",
    }
    if daemon_url is not None:
        env["SHOAL_DAEMON_URL"] = daemon_url
    with _session(env) as session:
        per_call = _per_call_ns(session)
        background = 0.0
        if daemon_url is not None:
            background = _background_ns_per_step(session, LOOP_STEPS)
        posted = session._reporter.posted
    return {
        "per_call_cpu_ns": round(per_call),
        "posting_cpu_ns_per_step": round(background),
        "share_of_10ms_step": round((per_call + background) / (STEP_S * 1e9), 6),
        "reports_posted": posted,
    }


def _new_generation_step(
    cluster: TrainingCluster, after: int, timeout_s: float
) -> tuple[int, float]:
    """(the first generation above `after`, when every one of its ranks had finished its first
    step)."""

    def done() -> tuple[int, float] | None:
        view = cluster.view("h0")
        generation = view.get("generation")
        if generation is None or generation <= after or len(view["ranks"]) != 6:
            return None
        steps = cluster.first_steps(generation)
        return (generation, max(steps.values())) if len(steps) == 6 else None

    found: tuple[int, float] = wait_until(done, timeout_s, 0.2, message="the next step")
    return found


def _phases(
    cluster: TrainingCluster, generation: int, faulted_at: float, restart_at: float | None
) -> dict[str, float | None]:
    """Where the time went: the fault to the restart decided, to the last new worker started
    (exec), to the last one in the group, to the last one's first step."""
    execs = cluster.first_steps(generation, "start", "exec_at").values()
    formed = cluster.first_steps(generation, "start", "at").values()
    stepped = cluster.first_steps(generation).values()

    def since(moments: Any) -> float | None:
        return None if not moments else round(max(moments) - faulted_at, 3)

    return {
        "decided_s": None if restart_at is None else round(restart_at - faulted_at, 3),
        "last_exec_s": since(execs),
        "group_formed_s": since(formed),
        "first_step_s": since(stepped),
    }


def fault_times(repeats: int, hang_s: float) -> list[dict[str, Any]]:
    """(b): `repeats` hangs and worker exits on one three-daemon cluster, alternating."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="training-bench-") as base:
        loopback = LoopbackCluster(3, Path(base) / "cluster")
        cluster = TrainingCluster(loopback, Path(base), {}, hang_s=hang_s)
        try:
            view = wait_until(lambda: cluster.advancing("h0"), 180, 1.0, message="6 ranks")
            for kind in ["hang", "worker_exit"] * repeats:
                victim = next(rank for rank in view["ranks"] if rank["node"] == "h2")
                sent = signal.SIGSTOP if kind == "hang" else signal.SIGKILL
                faulted_at = time.time()
                os.kill(victim["pid"], sent)
                generation, next_step = _new_generation_step(
                    cluster, view["generation"], hang_s + 120
                )
                view = wait_until(lambda: cluster.advancing("h0"), 120, 0.5, message="again")
                restarts = [r for r in view["restarts"] if r["at"] >= faulted_at - 1]
                results.append(
                    {
                        "kind": kind,
                        "to_next_step_s": round(next_step - faulted_at, 3),
                        "reason": restarts[0]["reason"] if restarts else None,
                        "hang_timeout_s": view["hang_timeout_s"],
                        "phases": _phases(
                            cluster,
                            generation,
                            faulted_at,
                            restarts[0]["at"] if restarts else None,
                        ),
                    }
                )
        finally:
            cluster.close()
            loopback.close()
    return results


def _summary(faults: list[dict[str, Any]]) -> dict[str, Any]:
    by_kind: dict[str, list[float]] = {}
    for fault in faults:
        by_kind.setdefault(fault["kind"], []).append(fault["to_next_step_s"])
    return {
        kind: {"median_s": round(statistics.median(times), 3), "max_s": max(times)}
        for kind, times in by_kind.items()
    }


def _daemon(base: Path) -> tuple[Any, str]:
    """A daemon (its own process) that takes reports, and its URL."""
    cluster = LoopbackCluster(1, base / "one")
    host = cluster.hosts[0]
    env = {
        "SHOAL_NODE_ID": "bench",
        "SHOAL_P2P_PORT": str(host.port),
        "SHOAL_DATA_DIR": str(host.data_dir),
        "SHOAL_CONFIG": "",
    }
    host.spawn([sys.executable, "-m", "node.cli", "serve", "--no-mdns"], env=env, cwd=ROOT)
    url = f"http://{host.endpoint}"
    import urllib.request

    wait_until(lambda: urllib.request.urlopen(url + "/v1/health", timeout=2).status == 200, 60)
    return cluster, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="hangs and worker exits each")
    parser.add_argument("--hang-s", type=float, default=5.0, help="training_hang_s")
    parser.add_argument("--no-cluster", action="store_true", help="measure report() only")
    args = parser.parse_args()
    torch_modules()  # imported before anything is timed
    with tempfile.TemporaryDirectory(prefix="training-bench-") as base:
        cluster, url = _daemon(Path(base))
        try:
            with_daemon = report_cost(url)
        finally:
            cluster.close()
    without = report_cost(None)
    result: dict[str, Any] = {
        "host": platform.node(),
        "load_average": os.getloadavg(),
        "report": {"with_daemon": with_daemon, "without_daemon": without},
        "target_share": TARGET_SHARE,
        "met": with_daemon["share_of_10ms_step"] < TARGET_SHARE,
        "xid": "skipped: the GPU quarantine's fake-GPU seam is not on this branch",
    }
    if not args.no_cluster:
        faults = fault_times(args.repeats, args.hang_s)
        result["faults"] = faults
        result["fault_summary"] = _summary(faults)
        result["training_hang_s"] = args.hang_s
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
