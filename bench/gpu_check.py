"""The check a person runs on a GPU host: NVML beside nvidia-smi, the GPU fault sources and the
self-test through the fault watcher's own code, one NCCL group of all the host's GPUs formed
through a real daemon, two nodes splitting the GPUs, a training group that reports through
shoal.training_session() restarted after a hang, the weights broadcast and publish on the
device, digest speed, and the suite's `gpu` tests. Prints ONE JSON document.

Each section runs in its own child process under its own time budget (the whole check under
--timeout-s, 285 s by default) and reports {"ok": bool, ...figures..., "error": str | None};
a section that fails, hangs or cannot import what it needs never stops the others. Without
CUDA it prints {"skipped": "no CUDA: ...", ...} and exits 0; otherwise it exits 1 when a
section is not ok. See docs/gpus.md, "The GPU check".

usage: python bench/gpu_check.py [--json] [--params 100000000] [--sections nvml,group,...]
[--timeout-s 285]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECTION_BUDGETS_S: dict[str, float] = {
    "nvml": 30.0,
    "faults": 90.0,
    "group": 60.0,
    "split": 75.0,
    "training": 150.0,
    "digest": 60.0,
    "broadcast": 120.0,
    "tests": 150.0,
}
"""Each section's own time budget, in the order the sections run; a section also never runs
past what is left of --timeout-s."""
SECTIONS = tuple(SECTION_BUDGETS_S)
DEFAULT_TIMEOUT_S = 285.0
DEFAULT_PARAMS = 100_000_000
MIN_SECTION_S = 5.0
TERM_GRACE_S = 10.0
SMI_FIELDS = ("index", "uuid", "name", "memory.total", "temperature.gpu", "power.draw")
SMI_COMMAND = (
    "nvidia-smi",
    f"--query-gpu={','.join(SMI_FIELDS)}",
    "--format=csv,noheader,nounits",
)
TEMPERATURE_TOLERANCE_C = 5.0
MEMORY_TOLERANCE_MIB = 1.0
DEVICE_DIGEST = "node.rl.digest:weights_digest"
"""Where the device digest lives (MODULE:NAME): called with a model whose parameters are on
the GPU, it returns the weights' digest computed there; --device-digest overrides it."""
BROADCAST_FUNCTIONS = ("bench_bare", "bench_publish")
BROADCAST_DTYPES = ("bfloat16", "float32")
BROADCAST_ROUNDS = 3
DUPLICATE_GPU = "Duplicate GPU detected"


# --- sections: the result shape and running each in a child -------------------------------


def section_result(ok: bool, error: str | None = None, **figures: Any) -> dict[str, Any]:
    """A section's entry: `ok`, its figures, and `error` (None when ok)."""
    return {"ok": ok, **figures, "error": error}


SectionRunner = Callable[[str, float], dict[str, Any]]
"""Runs section NAME within TIMEOUT_S seconds and returns its entry; may raise."""


def run_sections(
    names: Sequence[str],
    runner: SectionRunner,
    total_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, dict[str, Any]]:
    """Every section of `names` through `runner`, each within its budget and what is left of
    `total_s`; a section that raises or has no time left gets an error entry, the rest run."""
    deadline = clock() + total_s
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        left_s = deadline - clock()
        budget_s = min(SECTION_BUDGETS_S[name], left_s)
        if budget_s < MIN_SECTION_S:
            results[name] = section_result(
                False, f"not run: {left_s:.0f} s left of --timeout-s {total_s:g}"
            )
            continue
        started = clock()
        try:
            result = runner(name, budget_s)
        except Exception as exc:  # one section's failure never stops the others
            result = section_result(False, f"{type(exc).__name__}: {exc}")
        result.setdefault("ok", False)
        result.setdefault("error", None)
        result["seconds"] = round(clock() - started, 2)
        result["budget_s"] = round(budget_s, 1)
        results[name] = result
    return results


def last_json_line(text: str) -> dict[str, Any] | None:
    """The last line of `text` that is a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    return value
    return None


def child_section_runner(params: int, device_digest: str) -> SectionRunner:
    """Run each section as `gpu_check.py --child NAME` in its own session: a timeout sends
    SIGTERM to the whole session (the child cleans up its daemons), then SIGKILL."""

    def run(name: str, timeout_s: float) -> dict[str, Any]:
        argv = [sys.executable, __file__, "--child", name, "--params", str(params)]
        argv += ["--device-digest", device_digest, "--timeout-s", f"{timeout_s:.1f}"]
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=max(1.0, timeout_s - TERM_GRACE_S))
        except subprocess.TimeoutExpired:
            out, err = _stop_session(proc)
            found = last_json_line(out)
            return section_result(
                False,
                f"timed out after {timeout_s:.0f} s (its budget); stderr: {_tail(err)}",
                **({"partial": found} if found else {}),
            )
        found = last_json_line(out)
        if found is None:
            return section_result(
                False, f"the section printed no result (exit {proc.returncode}): {_tail(err)}"
            )
        return found

    return run


def _stop_session(proc: subprocess.Popen[str]) -> tuple[str, str]:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()


def _tail(text: str, chars: int = 1500) -> str:
    return text.strip()[-chars:]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH (packages carried on
    PYTHONPATH stay reachable), plus `extra`."""
    path = os.environ.get("PYTHONPATH")
    search = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    return {**os.environ, "PYTHONPATH": search, **(extra or {})}


# --- CUDA ----------------------------------------------------------------------------------


def import_torch() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
        import torch

    return torch


def cuda_devices() -> tuple[list[str], str | None]:
    """The names of the CUDA devices torch sees, and why there are none (None when some)."""
    try:
        torch = import_torch()
    except ImportError as exc:
        return [], f"no CUDA: torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return [], f"no CUDA: torch {torch.__version__} sees no CUDA device"
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], None


# --- (a) NVML beside nvidia-smi --------------------------------------------------------------


@dataclass(frozen=True)
class SmiGpu:
    """One line of `nvidia-smi --query-gpu=index,uuid,name,memory.total,temperature.gpu,
    power.draw --format=csv,noheader,nounits`; None where it printed N/A."""

    index: int
    uuid: str
    name: str
    memory_total_mib: float | None
    temperature_c: float | None
    power_w: float | None


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "N/A", "[Not Supported]"


def parse_smi(text: str) -> list[SmiGpu]:
    """The GPUs of nvidia-smi's CSV (SMI_COMMAND); a name may contain commas. ValueError on a
    line that is not index, uuid, name, memory, temperature, power."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < len(SMI_FIELDS) or not parts[0].isdigit():
            raise ValueError(f"nvidia-smi line {line!r} is not {', '.join(SMI_FIELDS)}")
        memory, temperature, power = parts[-3:]
        gpus.append(
            SmiGpu(
                index=int(parts[0]),
                uuid=parts[1],
                name=", ".join(parts[2:-3]),
                memory_total_mib=_number(memory),
                temperature_c=_number(temperature),
                power_w=_number(power),
            )
        )
    return gpus


def compare_nvml(smi: Sequence[SmiGpu], shoal: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where shoal's reading (GpuInfo.to_json() per GPU) differs from nvidia-smi's: the count,
    and per index the UUID, name, total memory and temperature (within tolerances)."""
    problems = []
    if len(smi) != len(shoal):
        problems.append(f"nvidia-smi shows {len(smi)} GPUs, shoal {len(shoal)}")
    by_index = {int(gpu.get("index", -1)): gpu for gpu in shoal}
    for gpu in smi:
        mine = by_index.get(gpu.index)
        if mine is None:
            problems.append(f"GPU {gpu.index}: shoal does not show it")
            continue
        if mine.get("uuid") != gpu.uuid:
            problems.append(f"GPU {gpu.index}: uuid {mine.get('uuid')!r} != {gpu.uuid!r}")
        if mine.get("name") != gpu.name:
            problems.append(f"GPU {gpu.index}: name {mine.get('name')!r} != {gpu.name!r}")
        problems += _differs(
            gpu.index, "memory_total_mib", gpu.memory_total_mib,
            mine.get("memory_total_mb"), MEMORY_TOLERANCE_MIB,
        )  # fmt: skip
        problems += _differs(
            gpu.index, "temperature_c", gpu.temperature_c,
            mine.get("temperature_c"), TEMPERATURE_TOLERANCE_C,
        )  # fmt: skip
    return problems


def _differs(
    index: int, what: str, smi: float | None, shoal: object, tolerance: float
) -> list[str]:
    if smi is None:
        return []
    if not isinstance(shoal, int | float):
        return [f"GPU {index}: shoal has no {what} (nvidia-smi: {smi:g})"]
    if abs(float(shoal) - smi) > tolerance:
        return [f"GPU {index}: {what} {float(shoal):g} (shoal) != {smi:g} (nvidia-smi)"]
    return []


def section_nvml(args: argparse.Namespace) -> dict[str, Any]:
    from health import GpuReader

    try:
        smi_run = subprocess.run(
            SMI_COMMAND, capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return section_result(False, f"cannot run nvidia-smi: {exc}")
    if smi_run.returncode != 0:
        return section_result(False, f"nvidia-smi exited {smi_run.returncode}: {smi_run.stderr}")
    smi = parse_smi(smi_run.stdout)
    reader = GpuReader()
    try:
        gpus, reason = reader.read_with_reason()
    finally:
        reader.close()
    shoal = [gpu.to_json() for gpu in gpus]
    problems = compare_nvml(smi, shoal)
    return section_result(
        not problems,
        "; ".join(problems) or None,
        nvidia_smi=[asdict(gpu) for gpu in smi],
        shoal=shoal,
        shoal_reason=reason or None,
        mismatches=problems,
    )


# --- GPU faults: the quarantine's reads, rule and self-test on real NVML -------------------


def section_faults(args: argparse.Namespace) -> dict[str, Any]:
    """Every GPU's fault sources read twice (the second read judged against the first, as the
    watcher does) through the watcher's deadline reads, and the self-test run once, timed: on a
    healthy host no fault, every GPU readable, the self-test passing."""
    import asyncio
    import shutil

    from health import GpuReader, judge, run_selftest
    from node.quarantine.watcher import DeadlineReads

    reader = GpuReader()

    async def observe() -> dict[str, Any]:
        indices = [gpu.index for gpu in reader.read()]
        reads = DeadlineReads(reader.read_faults)
        first = await reads.read(indices, 5.0)
        started = time.monotonic()
        second = await reads.read(indices, 5.0)
        read_s = time.monotonic() - started
        verdicts = [judge(now, then) for now, then in zip(second, first, strict=True)]
        selftest = await run_selftest(second, max(MIN_SECTION_S, args.timeout_s - 20.0))
        return {
            "gpus": len(indices),
            "read_s": round(read_s, 4),
            "samples": [asdict(sample) for sample in second],
            "faults": [fault.reason for verdict in verdicts for fault in verdict.faults],
            "not_faults": [note for verdict in verdicts for note in verdict.ignored],
            "selftest": selftest.to_json(),
            "dcgmi": shutil.which("dcgmi"),
        }

    try:
        found = asyncio.run(observe())
    finally:
        reader.close()
    problems = [*found["faults"]]
    if not found["selftest"]["passed"]:
        problems.append(f"self-test failed: {found['selftest']['detail']}")
    if not found["gpus"]:
        problems.append("shoal's reader sees no GPU")
    return section_result(not problems, "; ".join(problems) or None, **found)


# --- (b) and (c): real daemons whose training command forms one NCCL group -----------------


def free_port() -> int:
    """A port of 127.0.0.1 free for TCP and UDP (the API and membership) a moment ago."""
    for _ in range(50):
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no port of 127.0.0.1 is free for TCP and UDP")


CHECK_TIMEOUTS = {
    "heartbeat_interval_s": 0.1,
    "lease_s": 0.8,
    "election_min_s": 0.5,
    "election_max_s": 1.0,
}
"""The election timeouts of the check's daemons (a coordinator within a second or two)."""


@dataclass(frozen=True)
class NodeSpec:
    """A daemon of the check: its id, port and the host GPU indices it owns."""

    node_id: str
    port: int
    gpus: tuple[int, ...]


def node_config(spec: NodeSpec, data_dir: Path, out_dir: Path, voters: Sequence[str],
                seeds: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    """The config file of a node that owns `spec.gpus`, trains one process per GPU on NCCL and
    runs this file's --worker as its training command."""
    return {
        "node_id": spec.node_id,
        "bind": "127.0.0.1",
        "port": spec.port,
        "data_dir": str(data_dir),
        "mdns": False,
        "cluster_name": f"gpu-check-{os.getpid()}",
        "voters": list(voters),
        "seeds": list(seeds),
        "role": "training",
        "backend": "nccl",
        "gpus": list(spec.gpus),
        "training_nproc": len(spec.gpus),
        "training_command": [sys.executable, __file__, "--worker", str(out_dir)],
        "timeouts": dict(CHECK_TIMEOUTS),
    }


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # it answers, if unhealthy
    except OSError:
        return False


@contextlib.contextmanager
def daemons(specs: Sequence[NodeSpec], workdir: Path, out_dir: Path, timeout_s: float,
            changes: Mapping[str, Any] | None = None,
            ) -> Iterator[list[subprocess.Popen[bytes]]]:  # fmt: skip
    """`python -m node serve --config FILE` for each spec (node_config with `changes` over it),
    healthy within `timeout_s`; stopped (SIGTERM, then SIGKILL) at the end. RuntimeError names
    a daemon that exited, with its log."""
    procs: list[subprocess.Popen[bytes]] = []
    voters = [spec.node_id for spec in specs]
    try:
        for spec in specs:
            seeds = [f"127.0.0.1:{specs[0].port}"] if spec is not specs[0] else []
            config = node_config(spec, workdir / spec.node_id, out_dir, voters, seeds)
            config.update(changes or {})
            config_file = workdir / f"{spec.node_id}.json"
            config_file.write_text(json.dumps(config))  # JSON is YAML
            with (workdir / f"{spec.node_id}.log").open("ab") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "node", "serve", "--config", str(config_file)],
                        cwd=ROOT,
                        env=child_env(),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                    )
                )
        deadline = time.monotonic() + timeout_s
        for spec, proc in zip(specs, procs, strict=True):
            while not _healthy(spec.port):
                if proc.poll() is not None:
                    log_text = (workdir / f"{spec.node_id}.log").read_text(errors="replace")
                    raise RuntimeError(
                        f"daemon {spec.node_id} exited {proc.returncode}: {_tail(log_text)}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {spec.node_id} not healthy in {timeout_s:.0f} s")
                time.sleep(0.1)
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def read_worker_results(out_dir: Path) -> list[dict[str, Any]]:
    """What the workers wrote (one JSON file per worker process)."""
    results = []
    for path in sorted(out_dir.glob("worker-*.json")):
        with contextlib.suppress(ValueError):
            results.append(json.loads(path.read_text()))
    return results


def complete_generation(
    results: Sequence[Mapping[str, Any]], world_size: int
) -> list[Mapping[str, Any]] | None:
    """The reports of the newest generation in which all `world_size` ranks of a world of that
    size reported (each after joining), plus every report of a worker that could not join; None
    while no such generation is complete and no worker failed to join. A generation of a
    smaller world (a node that planned before the other joined) never counts."""
    unjoined = [r for r in results if r.get("generation") is None and r.get("error")]
    by_generation: dict[int, list[Mapping[str, Any]]] = {}
    for r in results:
        if r.get("generation") is not None and r.get("world_size") == world_size:
            by_generation.setdefault(int(r["generation"]), []).append(r)
    complete = [g for g, reports in by_generation.items() if len(reports) >= world_size]
    if complete:
        return [*by_generation[max(complete)], *unjoined]
    return list(unjoined) if unjoined else None


def judge_group(results: Sequence[Mapping[str, Any]], world_size: int) -> list[str]:
    """What is wrong with the group the workers formed: every rank 0..world_size-1 present
    once, on NCCL, with the all-reduced sum of rank + 1, and no two ranks on one GPU."""
    problems = [f"rank {r.get('rank')}: {r['error']}" for r in results if r.get("error")]
    good = [r for r in results if not r.get("error")]
    ranks = sorted(int(r["rank"]) for r in good)
    if ranks != list(range(world_size)):
        problems.append(f"ranks {ranks} reported, expected 0..{world_size - 1}")
    expected = world_size * (world_size + 1) / 2
    for r in good:
        if r.get("backend") != "nccl":
            problems.append(f"rank {r['rank']}: backend {r.get('backend')!r}, not nccl")
        if r.get("world_size") != world_size:
            problems.append(f"rank {r['rank']}: world size {r.get('world_size')}")
        if r.get("value") != expected:
            problems.append(f"rank {r['rank']}: all_reduce gave {r.get('value')}, not {expected}")
    uuids = [r.get("gpu_uuid") for r in good]
    if len(set(uuids)) != len(uuids):
        problems.append(f"two ranks share a GPU: {uuids}")
    return problems


def _logs_mention(workdir: Path, text: str) -> bool:
    """Whether any file under `workdir` but the SQLite ones (the daemons' and training logs,
    the workers' reports) contains `text`."""
    needle = text.encode()
    for path in workdir.rglob("*"):
        if not path.is_file() or ".db" in path.name:
            continue
        with contextlib.suppress(OSError):
            if path.stat().st_size < 64 * 1024 * 1024 and needle in path.read_bytes():
                return True
    return False


def run_group(specs: Sequence[NodeSpec], timeout_s: float) -> dict[str, Any]:
    """Start the daemons of `specs`, wait until every rank reported (or one failed), judge."""
    world_size = sum(len(spec.gpus) for spec in specs)
    with tempfile.TemporaryDirectory(prefix="shoal-gpu-check-") as tmp:
        workdir = Path(tmp)
        out_dir = workdir / "results"
        out_dir.mkdir()
        deadline = time.monotonic() + timeout_s
        started = time.monotonic()
        reports: list[dict[str, Any]] = []
        chosen: list[Mapping[str, Any]] | None = None
        error: str | None = None
        try:
            with daemons(specs, workdir, out_dir, timeout_s):
                while time.monotonic() < deadline:
                    reports = read_worker_results(out_dir)
                    chosen = complete_generation(reports, world_size)
                    if chosen is not None:
                        break
                    time.sleep(0.2)
                else:
                    error = (
                        f"no generation of {world_size} ranks completed in {timeout_s:.0f} s "
                        f"({len(reports)} worker reports)"
                    )
            _stop_workers(reports)
        except RuntimeError as exc:
            error = str(exc)
        results = list(chosen or [])
        problems = ([error] if error else []) + judge_group(results, world_size)
        duplicate = _logs_mention(workdir, DUPLICATE_GPU)
        if duplicate:
            problems.append(f"{DUPLICATE_GPU!r} appears in the logs")
        return section_result(
            not problems,
            "; ".join(problems) or None,
            nodes={spec.node_id: list(spec.gpus) for spec in specs},
            world_size=world_size,
            formed_s=round(time.monotonic() - started, 2),
            duplicate_gpu=duplicate,
            ranks=sorted(results, key=lambda r: (r.get("rank") is None, r.get("rank") or 0)),
            reports=len(reports),
        )


def _stop_workers(results: Sequence[Mapping[str, Any]]) -> None:
    """The workers wait to be stopped by their daemon; end any that outlived it, by pid."""
    for result in results:
        pid = result.get("pid")
        if isinstance(pid, int):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)


def section_group(args: argparse.Namespace) -> dict[str, Any]:
    torch = import_torch()
    count = torch.cuda.device_count()
    return run_group([NodeSpec("gpu-1", free_port(), tuple(range(count)))], args.timeout_s)


def split_gpus(count: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two disjoint halves of GPUs 0..count-1, the first one larger when count is odd."""
    half = (count + 1) // 2
    return tuple(range(half)), tuple(range(half, count))


def section_split(args: argparse.Namespace) -> dict[str, Any]:
    torch = import_torch()
    count = torch.cuda.device_count()
    if count < 2:
        return section_result(
            True, skipped=f"two nodes splitting the GPUs need 2 GPUs; this host has {count}"
        )
    first, second = split_gpus(count)
    specs = [NodeSpec("gpu-1", free_port(), first), NodeSpec("gpu-2", free_port(), second)]
    return run_group(specs, args.timeout_s)


def worker_main(out_dir: Path) -> None:
    """The training command of the check's daemons: join the group through the daemon (with
    this process's LOCAL_RANK), all-reduce rank + 1 on its GPU, write the result, then wait to
    be stopped (an exit would make the daemon start it again)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    record: dict[str, Any] = {"pid": os.getpid(), "local_rank": local_rank, "rank": None}
    record["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        torch = import_torch()
        from node.training.groups import join_group

        torch.cuda.set_device(local_rank)  # as a torchrun training script does
        started = time.perf_counter()
        if "local_rank" in inspect.signature(join_group).parameters:
            group = join_group(timeout_s=60, local_rank=local_rank)
        elif int(os.environ.get("LOCAL_WORLD_SIZE", "1")) == 1:
            group = join_group(timeout_s=60)
        else:
            raise TypeError("join_group takes no local_rank: several local ranks cannot join")
        record["join_s"] = round(time.perf_counter() - started, 3)
        record.update(generation=group.generation, rank=group.rank, world_size=group.world_size)
        dist = torch.distributed
        device = torch.cuda.current_device()  # LOCAL_RANK's, unless joining chose another
        tensor = torch.full((4,), float(group.rank + 1), device=f"cuda:{device}")
        started = time.perf_counter()
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        record["first_all_reduce_s"] = round(time.perf_counter() - started, 3)
        record.update(
            backend=str(dist.get_backend()),
            value=float(tensor[0].item()),
            device_index=device,
            gpu_uuid=str(torch.cuda.get_device_properties(device).uuid),
        )
    except Exception as exc:  # reported in the result file, judged by the parent
        record["error"] = f"{type(exc).__name__}: {exc}"
    path = out_dir / f"worker-{os.getpid()}.json"
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(record))
    temp.replace(path)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(1)


# --- (e) a training group watched by the cluster: a hang, a restart -------------------------

TRAINING_HANG_S = 10.0
"""training_hang_s of the section's daemon; the restart must come within this (or the hang
timeout /v1/training shows, when 20 step times are longer) + 5 s."""
TRAINING_SAMPLES = 50
"""Steps a worker times (its CUDA step and its report() call) before it writes them."""
TRAINING_SIZE = 4096


def train_worker_main(out_dir: Path) -> None:
    """The training command of section `training`: shoal.training_session() (NCCL, one rank per
    GPU), a step of a matmul and an all_reduce on its GPU, a report after each. It writes its
    first step's time, then the median CUDA step and report() cost of TRAINING_SAMPLES steps."""
    import shoal

    torch = import_torch()
    dist = torch.distributed
    with shoal.training_session() as session:
        record: dict[str, Any] = {"pid": os.getpid(), "rank": session.rank}
        record.update(generation=session.generation, backend=session.group.backend)
        path = out_dir / f"train-{os.getpid()}.json"
        weights = torch.randn(TRAINING_SIZE, TRAINING_SIZE, device="cuda")
        steps_s: list[float] = []
        reports_ns: list[int] = []
        step = 0
        while True:
            started = time.perf_counter()
            product = weights @ weights
            dist.all_reduce(product[0])
            torch.cuda.synchronize()
            steps_s.append(time.perf_counter() - started)
            before = time.thread_time_ns()
            session.report(step, loss=float(step))
            reports_ns.append(time.thread_time_ns() - before)
            if step == 0 or step == TRAINING_SAMPLES:
                record["first_step_at"] = record.get("first_step_at") or time.time()
                if step:
                    record["cuda_step_ms"] = round(statistics.median(steps_s[1:]) * 1e3, 3)
                    record["report_cpu_ns"] = round(statistics.median(reports_ns[1:]))
                temp = path.with_suffix(".tmp")
                temp.write_text(json.dumps(record))
                temp.replace(path)
            step += 1


def read_training(out_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(out_dir.glob("train-*.json")):
        with contextlib.suppress(ValueError):
            found.append(json.loads(path.read_text()))
    return found


def training_verdict(
    world_size: int,
    restart: Mapping[str, Any] | None,
    stopped_at: float,
    timeout_s: float,
    next_generation: Sequence[Mapping[str, Any]],
    victim_ended: bool,
) -> list[str]:
    """What is wrong with the group's recovery from a hang: a restart with reason `hang` within
    `timeout_s` + 5 s of the stop, the stopped worker ended, every rank of the new generation
    stepping on nccl."""
    problems = []
    if restart is None:
        problems.append("no restart with reason hang")
    elif restart["at"] - stopped_at > timeout_s + 5:
        problems.append(f"the restart came {restart['at'] - stopped_at:.1f} s after the stop")
    if not victim_ended:
        problems.append("the stopped worker was not ended")
    if len(next_generation) != world_size:
        problems.append(f"{len(next_generation)} of {world_size} ranks stepped again")
    if any(worker.get("backend") != "nccl" for worker in next_generation):
        problems.append("a rank of the new generation is not on nccl")
    return problems


def _stepping(
    out_dir: Path, count: int, field: str, after: int = -1
) -> list[dict[str, Any]] | None:
    """The workers of a generation above `after` once all `count` wrote `field`, else None."""
    found = [w for w in read_training(out_dir) if w["generation"] > after and field in w]
    return found if len(found) == count else None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _training_view(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/training", timeout=5) as answer:
        document: dict[str, Any] = json.loads(answer.read())
    return document


def _until(found: Callable[[], Any], deadline: float, what: str) -> Any:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            value = found()
            if value:
                return value
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not within the section's budget")


def section_training(args: argparse.Namespace) -> dict[str, Any]:
    torch = import_torch()
    count = torch.cuda.device_count()
    spec = NodeSpec("gpu-1", free_port(), tuple(range(count)))
    deadline = time.monotonic() + max(1.0, args.timeout_s - TERM_GRACE_S)
    with tempfile.TemporaryDirectory(prefix="shoal-gpu-training-") as tmp:
        out_dir = Path(tmp) / "results"
        out_dir.mkdir()
        changes = {
            "training_command": [sys.executable, __file__, "--train-worker", str(out_dir)],
            "training_hang_s": TRAINING_HANG_S,
            "timeouts": {**CHECK_TIMEOUTS, "collective_s": 60.0},
        }
        try:
            with daemons([spec], Path(tmp), out_dir, args.timeout_s, changes):
                first = _until(
                    lambda: _stepping(out_dir, count, "report_cpu_ns"), deadline, "every rank"
                )
                timeout_s = max(TRAINING_HANG_S, _training_view(spec.port)["hang_timeout_s"])
                victim = max(first, key=lambda worker: worker["rank"])
                os.kill(victim["pid"], signal.SIGSTOP)
                stopped_at = time.time()
                restart = _until(
                    lambda: next(
                        (r for r in _training_view(spec.port)["restarts"] if r["reason"] == "hang"),
                        None,
                    ),
                    deadline,
                    "a restart for the hang",
                )
                newer = _until(
                    lambda: _stepping(out_dir, count, "first_step_at", victim["generation"]),
                    deadline,
                    "every rank stepping in the new generation",
                )
                ended = _gone(victim["pid"])
        except RuntimeError as exc:
            return section_result(False, str(exc), world_size=count)
        finally:
            for worker in read_training(out_dir):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(worker["pid"], signal.SIGKILL)
    problems = training_verdict(count, restart, stopped_at, timeout_s, newer, ended)
    report_ns = statistics.median(worker["report_cpu_ns"] for worker in first)
    step_ms = statistics.median(worker["cuda_step_ms"] for worker in first)
    return section_result(
        not problems,
        "; ".join(problems) or None,
        world_size=count,
        hang_timeout_s=timeout_s,
        stop_to_restart_s=round(restart["at"] - stopped_at, 3),
        stop_to_next_step_s=round(max(w["first_step_at"] for w in newer) - stopped_at, 3),
        stopped_worker_ended=ended,
        report_cpu_ns=report_ns,
        cuda_step_ms=step_ms,
        report_share_of_step=round(report_ns / (step_ms * 1e6), 6) if step_ms else None,
    )


# --- (d) broadcast and publish on the device ----------------------------------------------


def _gbps(size_bytes: int, seconds: float) -> float | None:
    return round(size_bytes / seconds / 1e9, 2) if seconds > 0 else None


def resolve(module_name: str, names: Sequence[str]) -> dict[str, Any]:
    """`names` of `module_name`; ImportError / AttributeError naming what is missing."""
    module = importlib.import_module(module_name)
    missing = [name for name in names if not hasattr(module, name)]
    if missing:
        raise AttributeError(f"{module_name} has no {', '.join(missing)}")
    return {name: getattr(module, name) for name in names}


def section_broadcast(args: argparse.Namespace) -> dict[str, Any]:
    """bench/rl_bench.py's bare broadcast and shoal's publish (with its digest) of --params
    parameters on the GPU, in bf16 and fp32. Needs `bench_bare(params, rounds, *, device,
    dtype)` and `bench_publish(params, rounds, phases, *, device, dtype)` there."""
    try:
        functions = resolve("bench.rl_bench", BROADCAST_FUNCTIONS)
    except (ImportError, AttributeError) as exc:
        return section_result(False, f"{type(exc).__name__}: {exc}")
    lacking = []
    for name, fn in functions.items():
        absent = {"device", "dtype"} - set(inspect.signature(fn).parameters)
        if absent:
            lacking.append(f"{name} takes no {', '.join(sorted(absent))}")
    if lacking:
        return section_result(
            False, f"bench/rl_bench.py cannot run on the GPU: {'; '.join(lacking)}"
        )
    figures: dict[str, Any] = {"params": args.params, "rounds": BROADCAST_ROUNDS}
    errors = []
    for dtype in BROADCAST_DTYPES:
        size_bytes = args.params * (2 if dtype == "bfloat16" else 4)
        entry: dict[str, Any] = {"bytes": size_bytes}
        try:
            bare = functions["bench_bare"](
                args.params, BROADCAST_ROUNDS, device="cuda", dtype=dtype
            )
            phases: list[dict[str, float]] = []
            publish = functions["bench_publish"](
                args.params, BROADCAST_ROUNDS, phases, device="cuda", dtype=dtype
            )
            bare_s, publish_s = statistics.median(bare), statistics.median(publish)
            entry.update(
                bare_s=round(bare_s, 4),
                bare_gbps=_gbps(size_bytes, bare_s),
                publish_s=round(publish_s, 4),
                publish_gbps=_gbps(size_bytes, publish_s),
                overhead_s=round(publish_s - bare_s, 4),
                phases_s=phases[-1] if phases else None,
            )
        except Exception as exc:  # reported per dtype; the other dtype still runs
            entry["error"] = f"{type(exc).__name__}: {exc}"
            errors.append(f"{dtype}: {entry['error']}")
        figures[dtype] = entry
    return section_result(not errors, "; ".join(errors) or None, **figures)


# --- (e) digest speed on the device and on the CPU ----------------------------------------


def _model(torch: Any, params: int, device: str) -> Any:
    tensors = 20
    generator = torch.Generator(device=device).manual_seed(0)
    return torch.nn.ParameterList(
        torch.nn.Parameter(
            torch.randn(params // tensors, generator=generator, device=device),
            requires_grad=False,
        )
        for _ in range(tensors)
    )


def _timed(fn: Callable[[], object], sync: Callable[[], None]) -> tuple[object, float]:
    sync()
    started = time.perf_counter()
    value = fn()
    sync()
    return value, time.perf_counter() - started


def same_digest(first: object, second: object) -> bool:
    """Whether two digests are equal: text, bytes, or tensors (compared as lists)."""
    tolist = getattr(first, "tolist", None)
    if callable(tolist):
        other = getattr(second, "tolist", None)
        return callable(other) and bool(tolist() == other())
    return first == second


def section_digest(args: argparse.Namespace) -> dict[str, Any]:
    """GB/s of shoal's weights digest of a CPU model (node.rl.weights_digest) and of the
    device digest (DEVICE_DIGEST or --device-digest) of the same model on the GPU."""
    torch = import_torch()
    from node.rl import weights_digest

    size_bytes = args.params // 20 * 20 * 4
    figures: dict[str, Any] = {"bytes": size_bytes}
    cpu_model = _model(torch, args.params, "cpu")
    weights_digest(cpu_model)  # warm-up: the hashing threads start
    _, cpu_s = _timed(lambda: weights_digest(cpu_model), lambda: None)
    figures["cpu_gbps"] = _gbps(size_bytes, cpu_s)
    module_name, _, name = args.device_digest.partition(":")
    try:
        device_digest = resolve(module_name, [name])[name]
    except (ImportError, AttributeError, ValueError) as exc:
        return section_result(
            False, f"no device digest at {args.device_digest}: {type(exc).__name__}: {exc}",
            **figures,
        )  # fmt: skip
    device_model = _model(torch, args.params, "cuda")
    sync = torch.cuda.synchronize
    try:
        first, _ = _timed(lambda: device_digest(device_model), sync)  # warm-up
        again, device_s = _timed(lambda: device_digest(device_model), sync)
        with torch.no_grad():
            device_model[0].view(-1)[0] += 1.0
        changed, _ = _timed(lambda: device_digest(device_model), sync)
    except Exception as exc:  # a device digest that fails is this section's error
        return section_result(False, f"{args.device_digest}: {type(exc).__name__}: {exc}",
                              **figures)  # fmt: skip
    figures["device_gbps"] = _gbps(size_bytes, device_s)
    problems = []
    if not same_digest(first, again):
        problems.append("the device digest differs between two runs over the same weights")
    if same_digest(changed, again):
        problems.append("the device digest did not change when one parameter did")
    return section_result(not problems, "; ".join(problems) or None, **figures)


# --- (f) the suite's gpu tests --------------------------------------------------------------

GPU_MARK = re.compile(r"\bmark\.gpu\b")
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def parse_pytest_summary(output: str) -> dict[str, int]:
    """Counts of pytest's last summary line: {"passed": 3, "skipped": 1, ...}."""
    for line in reversed(output.splitlines()):
        found = _SUMMARY.findall(line)
        if found:
            counts: dict[str, int] = {}
            for number, kind in found:
                key = "errors" if kind.startswith("error") else kind
                counts[key] = counts.get(key, 0) + int(number)
            return counts
    return {}


def gpu_test_files(tests_dir: Path) -> list[Path]:
    """The test modules under `tests_dir` that mark tests `gpu` (by their text: collecting the
    whole suite would stop at a module whose optional dependency this host lacks)."""
    return [
        path
        for path in sorted(tests_dir.rglob("test_*.py"))
        if GPU_MARK.search(path.read_text(errors="replace"))
    ]


def section_tests(args: argparse.Namespace) -> dict[str, Any]:
    files = gpu_test_files(ROOT / "tests")
    if not files:
        return section_result(False, "no test module under tests/ marks a test gpu")
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"]
    argv += ["-p", "no:benchmark", *(str(path.relative_to(ROOT)) for path in files)]
    try:
        run = subprocess.run(
            argv, cwd=ROOT, env=child_env(), capture_output=True, text=True,
            timeout=max(1.0, args.timeout_s - TERM_GRACE_S), check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout if isinstance(exc.stdout, str) else ""
        return section_result(False, f"pytest -m gpu ran past its budget: {_tail(output)}")
    counts = parse_pytest_summary(run.stdout)
    ok = run.returncode == 0 and counts.get("passed", 0) > 0
    error = None if ok else f"pytest exited {run.returncode}: {_tail(run.stdout + run.stderr)}"
    modules = [str(path.relative_to(ROOT)) for path in files]
    return section_result(ok, error, exit_code=run.returncode, counts=counts, modules=modules)


# --- main -----------------------------------------------------------------------------------

SECTION_FUNCTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "nvml": section_nvml,
    "faults": section_faults,
    "group": section_group,
    "split": section_split,
    "training": section_training,
    "digest": section_digest,
    "broadcast": section_broadcast,
    "tests": section_tests,
}


def parse_sections(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}"
        )
    return [name for name in SECTIONS if name in names]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="one line of JSON (else indented)")
    parser.add_argument("--params", type=int, default=DEFAULT_PARAMS)
    parser.add_argument("--sections", type=parse_sections, default=list(SECTIONS))
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--device-digest", default=DEVICE_DIGEST, help="MODULE:NAME")
    parser.add_argument("--child", choices=SECTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--train-worker", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def check(args: argparse.Namespace, runner: SectionRunner | None = None) -> dict[str, Any]:
    """The whole check's document (see the module docstring)."""
    started = time.monotonic()
    devices, missing = cuda_devices()
    document: dict[str, Any] = {
        "check": "shoal gpu_check",
        "python": sys.version.split()[0],
        "cuda": missing is None,
        "devices": devices,
        "params": args.params,
        "timeout_s": args.timeout_s,
        "skipped": missing,
        "ok": missing is None,
        "sections": {},
    }
    if missing is None:
        runner = runner or child_section_runner(args.params, args.device_digest)
        sections = run_sections(args.sections, runner, args.timeout_s)
        document["sections"] = sections
        document["ok"] = all(section["ok"] for section in sections.values())
    document["elapsed_s"] = round(time.monotonic() - started, 2)
    return document


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        worker_main(args.worker)
        return 0
    if args.train_worker is not None:
        train_worker_main(args.train_worker)
        return 0
    if args.child is not None:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups
        try:
            result = SECTION_FUNCTIONS[args.child](args)
        except Exception as exc:  # the section's entry says what failed
            result = section_result(False, f"{type(exc).__name__}: {exc}")
        print(json.dumps(result), flush=True)
        return 0
    document = check(args)
    print(json.dumps(document, indent=None if args.json else 2), flush=True)
    return 0 if document["ok"] or document["skipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
