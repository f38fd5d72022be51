"""Start-up time of the command lines: `shoal --version`, `shoal --help`, `shoal status --json`
and `cluster_monitor --json --once` against a local node this benchmark starts (temp data dir,
127.0.0.1), and `import node.errors`, each against `python -c pass` in the same run (median of N
runs, ms and ratio). Prints JSON.
Usage: .venv/bin/python bench/cli_bench.py [--runs 15] [--only NAME ...]"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOALS_MS = {
    "shoal --version": 150.0,
    "shoal --help": 150.0,
    "shoal status --json": 300.0,
    "cluster_monitor --json --once": 300.0,
}
COUNT_MODULES = "import sys, {module}; print(len(sys.modules))"
NODE_START_TIMEOUT_S = 60.0


def command(script: str, module: str) -> list[str]:
    """The console script next to this interpreter, else `python -m module`."""
    path = BIN / script
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def clean_env(home: Path) -> dict[str, str]:
    """This environment without SHOAL_* (no config file of the user's) and with this tree first
    on PYTHONPATH, so the console scripts run this checkout's code."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHOAL_")}
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(ROOT), os.environ.get("PYTHONPATH", "")) if part
    )
    env["HOME"] = str(home)
    env["COLUMNS"] = "100"
    return env


def time_runs(argv: Sequence[str], env: dict[str, str], runs: int) -> dict[str, Any]:
    """Median, best and worst wall time of `runs` runs of `argv` (after one warm-up run), and
    the exit status of the last."""
    subprocess.run(argv, env=env, capture_output=True, check=False, timeout=120)
    times_ms: list[float] = []
    returncode = 0
    for _ in range(runs):
        started = time.perf_counter()
        result = subprocess.run(argv, env=env, capture_output=True, check=False, timeout=120)
        times_ms.append(1000 * (time.perf_counter() - started))
        returncode = result.returncode
    return {
        "median_ms": round(statistics.median(times_ms), 1),
        "min_ms": round(min(times_ms), 1),
        "max_ms": round(max(times_ms), 1),
        "exit_code": returncode,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_status(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + NODE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"shoal serve exited with {process.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{url}/v1/status", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"shoal serve did not answer {url}/v1/status in {NODE_START_TIMEOUT_S} s")


@contextlib.contextmanager
def local_node(env: dict[str, str], data_dir: Path) -> Iterator[str]:
    """`shoal serve` on 127.0.0.1 with its data in `data_dir`; yields its URL."""
    port = free_port()
    argv = [
        *command("shoal", "node"),
        "serve",
        "--data-dir",
        str(data_dir),
        "--node-id",
        "bench",
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-mdns",
    ]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_status(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def module_count(module: str, env: dict[str, str]) -> int:
    code = COUNT_MODULES.format(module=module)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return int(result.stdout.strip())


def with_baseline(result: dict[str, Any], baseline_ms: float, goal_ms: float | None) -> None:
    result["ratio_to_python"] = round(result["median_ms"] / baseline_ms, 2)
    result["over_python_ms"] = round(result["median_ms"] - baseline_ms, 1)
    if goal_ms is not None:
        result["goal_ms"] = goal_ms
        result["meets_goal"] = result["median_ms"] <= goal_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command (median)")
    parser.add_argument("--only", nargs="*", default=None, help="names of the commands to time")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cli-bench-"))
    try:
        env = clean_env(work / "home")
        (work / "home").mkdir()
        baseline = time_runs([sys.executable, "-c", "pass"], env, args.runs)
        results: dict[str, Any] = {}
        shoal = command("shoal", "node")
        monitor = command("cluster_monitor", "health.cluster_monitor")
        light = {
            "python -c 'import node.errors'": [sys.executable, "-c", "import node.errors"],
            "shoal --version": [*shoal, "--version"],
            "shoal version": [*shoal, "version"],
            "shoal --help": [*shoal, "--help"],
        }
        wanted = set(args.only) if args.only else None
        for name, argv in light.items():
            if wanted is None or name in wanted:
                results[name] = time_runs(argv, env, args.runs)
        against_node = {
            "shoal status --json": [*shoal, "status", "--json", "--node"],
            "cluster_monitor --json --once": [*monitor, "--json", "--once", "--node"],
            "cluster_monitor --json": [*monitor, "--json", "--node"],
        }
        if wanted is None or wanted & set(against_node):
            with local_node(env, work / "node") as url:
                for name, argv in against_node.items():
                    if wanted is None or name in wanted:
                        results[name] = time_runs([*argv, url], env, args.runs)
        for name, result in results.items():
            with_baseline(result, baseline["median_ms"], GOALS_MS.get(name))
        if wanted is None or "python -c 'import node.errors'" in wanted:
            results["python -c 'import node.errors'"]["modules"] = module_count("node.errors", env)
        report = {
            "benchmark": "cli_start",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "runs": args.runs,
            "python -c pass": baseline,
            "commands": results,
        }
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
