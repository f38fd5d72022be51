"""Start-up time of the command lines: `shoal --version`, `shoal --help`, `shoal status --json`
and `cluster_monitor --json --once` against a local node this benchmark starts (temp data dir,
127.0.0.1), and `import node.errors`; each interleaved run by run with `python -c pass` (median of
N runs, ms and ratio), so a busy machine slows both alike. With `--baseline-tree DIR` (another
checkout, e.g. `git archive REV | tar -x -C DIR`) each command of that tree runs interleaved too.
With `--instructions` each command runs once under valgrind's callgrind and its instruction
count is reported instead (beside `python -c pass`'s): a figure a shared, loaded machine does
not change. Prints JSON. Usage: .venv/bin/python bench/cli_bench.py [--runs 15]
[--only NAME ...] [--baseline-tree DIR] [--instructions]"""

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
from collections.abc import Iterator
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
NODE_ERRORS = "python -c 'import node.errors'"
COUNT_MODULES = "import sys, node.errors; print(len(sys.modules))"
NODE_START_TIMEOUT_S = 60.0
# typer's own floor: the --help of an app of one command with one option (rich help, as shoal's)
TYPER_ALONE = (
    "import typer\n"
    "app = typer.Typer(add_completion=False)\n"
    "@app.command()\n"
    "def hello(name: str = 'x') -> None:\n"
    "    pass\n"
    "app(['--help'])\n"
)
PYTHON = "python -c pass"


def command(script: str, module: str) -> list[str]:
    """The console script next to this interpreter, else `python -m module`."""
    path = BIN / script
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def clean_env(tree: Path, home: Path) -> dict[str, str]:
    """This environment without SHOAL_* (no config file of the user's) and with `tree` first
    on PYTHONPATH, so the console scripts run that checkout's code; bytecode is written."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHOAL_")}
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(tree), os.environ.get("PYTHONPATH", "")) if part
    )
    env["HOME"] = str(home)
    env["COLUMNS"] = "100"
    # as installed: bytecode compiled once (the warm-up run writes it), not on every start
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


Variant = tuple[list[str], dict[str, str]]


def run_once(variant: Variant) -> tuple[float, int]:
    argv, env = variant
    started = time.perf_counter()
    # run in HOME, not here: `python -c` puts its working directory first on sys.path
    result = subprocess.run(
        argv, env=env, cwd=env["HOME"], capture_output=True, check=False, timeout=120
    )
    return 1000 * (time.perf_counter() - started), result.returncode


def time_interleaved(variants: dict[str, Variant], runs: int) -> dict[str, dict[str, Any]]:
    """Each variant run `runs` times (after one warm-up run each), taking turns run by run;
    median, best and worst wall time and the exit status of the last run of each."""
    for variant in variants.values():
        run_once(variant)
    times: dict[str, list[float]] = {label: [] for label in variants}
    codes: dict[str, int] = {}
    for _ in range(runs):
        for label, variant in variants.items():
            elapsed_ms, codes[label] = run_once(variant)
            times[label].append(elapsed_ms)
    return {
        label: {
            "median_ms": round(statistics.median(times[label]), 1),
            "min_ms": round(min(times[label]), 1),
            "max_ms": round(max(times[label]), 1),
            "exit_code": codes[label],
        }
        for label in variants
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


def module_count(env: dict[str, str]) -> int:
    result = subprocess.run(
        [sys.executable, "-c", COUNT_MODULES],
        env=env,
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(result.stdout.strip())


def commands(url: str) -> dict[str, list[str]]:
    """The timed command lines; those against a node ask `url`."""
    shoal = command("shoal", "node")
    monitor = command("cluster_monitor", "health.cluster_monitor")
    return {
        NODE_ERRORS: [sys.executable, "-c", "import node.errors"],
        "python -c 'import typer'": [sys.executable, "-c", "import typer"],
        "typer alone: --help of a one-command app": [sys.executable, "-c", TYPER_ALONE],
        "shoal --version": [*shoal, "--version"],
        "shoal version": [*shoal, "version"],
        "shoal --help": [*shoal, "--help"],
        "shoal status --json": [*shoal, "status", "--json", "--node", url],
        "cluster_monitor --json --once": [*monitor, "--json", "--once", "--node", url],
        "cluster_monitor --json": [*monitor, "--json", "--node", url],
    }


CALLGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """Instructions one run of `argv` executes (valgrind's callgrind, no profile written): a
    figure a busy machine does not change, unlike the wall time."""
    result = subprocess.run(
        [*CALLGRIND, *argv], env=env, cwd=env["HOME"], capture_output=True, text=True,
        check=False, timeout=900,
    )  # fmt: skip
    for line in result.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1].strip())
    raise RuntimeError(f"no instruction count from callgrind: {result.stderr[-500:]}")


def count_instructions(argv: list[str], envs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """One command's instructions in each tree of `envs`, beside `python -c pass`'s."""
    python = instructions([sys.executable, "-c", "pass"], envs["this tree"])
    result: dict[str, Any] = {"python_-c_pass_instructions": python}
    for tree, env in envs.items():
        run_once((argv, env))  # writes the bytecode, as an installed shoal has it
        count = instructions(argv, env)
        result[tree] = {"instructions": count, "ratio_to_python": round(count / python, 2)}
    return result


def measure(
    argv: list[str], envs: dict[str, dict[str, str]], runs: int, goal_ms: float | None
) -> dict[str, Any]:
    """One command in each tree of `envs`, interleaved with `python -c pass`."""
    variants: dict[str, Variant] = {PYTHON: ([sys.executable, "-c", "pass"], envs["this tree"])}
    variants.update({tree: (argv, env) for tree, env in envs.items()})
    timed = time_interleaved(variants, runs)
    python_ms = timed.pop(PYTHON)["median_ms"]
    result: dict[str, Any] = {"python_-c_pass_ms": python_ms}
    for tree, stats in timed.items():
        stats["ratio_to_python"] = round(stats["median_ms"] / python_ms, 2)
        stats["over_python_ms"] = round(stats["median_ms"] - python_ms, 1)
        if goal_ms is not None and tree == "this tree":
            stats["goal_ms"] = goal_ms
            stats["meets_goal"] = stats["median_ms"] <= goal_ms
        result[tree] = stats
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command (median)")
    parser.add_argument("--only", nargs="*", default=None, help="names of the commands to time")
    parser.add_argument(
        "--baseline-tree", type=Path, default=None, help="another checkout to time alongside"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions (valgrind callgrind, one run each) instead of timing",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cli-bench-"))
    try:
        (work / "home").mkdir()
        envs = {"this tree": clean_env(ROOT, work / "home")}
        if args.baseline_tree is not None:
            envs["baseline tree"] = clean_env(args.baseline_tree.resolve(), work / "home")
        results: dict[str, Any] = {}
        with local_node(envs["this tree"], work / "node") as url:
            for name, argv in commands(url).items():
                if args.only is not None and name not in args.only:
                    continue
                if args.instructions:
                    results[name] = count_instructions(argv, envs)
                else:
                    results[name] = measure(argv, envs, args.runs, GOALS_MS.get(name))
        modules = {tree: module_count(env) for tree, env in envs.items()}
        report = {
            "benchmark": "cli_start",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "runs": args.runs,
            "modules_after_import_node_errors": modules,
            "commands": results,
        }
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
