"""`shoal ssh check` and `detect_host_memory`: one probe command per host, parsed without SSH."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from config import Inventory
from node.errors import SSHError
from node.ssh.executor import DEFAULT_KNOWN_HOSTS, SSHExecutor, SSHResult

PROBE_TIMEOUT_S = 30.0
_KIB_PER_GB = 1024 * 1024


def probe_script(path: str = "~") -> str:
    """A POSIX sh script printing `key=value` lines: python, mem_kb, disk_free_kb (at `path` or
    its nearest existing parent) and one gpu_mib line per GPU when nvidia-smi is present."""
    quoted = shlex.quote(path[2:] if path.startswith("~/") else path)
    start = '"$HOME"' if path == "~" else (f'"$HOME"/{quoted}' if path.startswith("~/") else quoted)
    return "\n".join(
        [
            "py=$(python3 -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])' "
            "2>/dev/null || echo none)",
            'echo "python=$py"',
            "echo \"mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)\"",
            f"p={start}",
            'while [ ! -e "$p" ]; do p=$(dirname "$p"); done',
            'echo "disk_free_kb=$(df -Pk "$p" 2>/dev/null | awk \'NR==2 {print $4}\')"',
            "if command -v nvidia-smi >/dev/null 2>&1; then",
            "  nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits "
            "2>/dev/null | sed 's/^ */gpu_mib=/'",
            "fi",
        ]
    )


@dataclass(frozen=True)
class HostMemory:
    """Memory of a host: RAM, the memory of its smallest GPU (0 without GPUs), GPU count."""

    cpu_memory_gb: float
    gpu_memory_gb: float
    gpu_count: int


@dataclass(frozen=True)
class HostCheck:
    """One row of `shoal ssh check`. `error` None: reachable with a trusted host key."""

    host: str
    python: str | None
    disk_free_gb: float | None
    memory: HostMemory | None
    duration_s: float
    error: str | None = None

    @property
    def host_key(self) -> str:
        """ok once connected; "unknown or changed" when the key was the failure; else "-"."""
        if self.error is None:
            return "ok"
        return "unknown or changed" if "host key" in self.error else "-"


def parse_probe(output: str) -> tuple[str | None, float | None, HostMemory]:
    """(python version, free disk GB, memory) from the probe script's output."""
    values: dict[str, list[str]] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and value.strip():
            values.setdefault(key.strip(), []).append(value.strip())

    def number(key: str) -> float | None:
        try:
            return float(values[key][0])
        except (KeyError, ValueError):
            return None

    python = values.get("python", [None])[0]
    disk_kb = number("disk_free_kb")
    mem_kb = number("mem_kb") or 0.0
    gpus = []
    for raw in values.get("gpu_mib", []):
        try:
            gpus.append(float(raw) / 1024)
        except ValueError:
            continue
    memory = HostMemory(
        cpu_memory_gb=round(mem_kb / _KIB_PER_GB, 2),
        gpu_memory_gb=round(min(gpus), 2) if gpus else 0.0,
        gpu_count=len(gpus),
    )
    return (
        (None if python == "none" else python),
        (None if disk_kb is None else round(disk_kb / _KIB_PER_GB, 2)),
        memory,
    )


def check_from_result(result: SSHResult) -> HostCheck:
    """The check row of one probe result."""
    if result.error is not None:
        return HostCheck(result.host, None, None, None, result.duration_s, result.error)
    if result.exit_code != 0:
        return HostCheck(
            result.host,
            None,
            None,
            None,
            result.duration_s,
            f"probe exited {result.exit_code}: {result.stderr.strip()[-200:]}",
        )
    python, disk, memory = parse_probe(result.stdout)
    return HostCheck(result.host, python, disk, memory, result.duration_s)


async def check_hosts(
    executor: SSHExecutor, hosts: Iterable[str], paths: Mapping[str, str] | None = None
) -> dict[str, HostCheck]:
    """Reachability, host key, python, free disk (at each host's `path`) and GPUs per host."""
    names = list(hosts)
    paths = paths or {}
    results = await _gather(executor, {h: probe_script(paths.get(h, "~")) for h in names})
    return {name: check_from_result(results[name]) for name in names}


async def _gather(executor: SSHExecutor, scripts: Mapping[str, str]) -> dict[str, SSHResult]:
    names = list(scripts)
    found = await asyncio.gather(
        *(executor.run(h, ["sh", "-c", scripts[h]], PROBE_TIMEOUT_S) for h in names)
    )
    return dict(zip(names, found, strict=True))


async def detect_host_memory(
    host: str,
    executor: SSHExecutor | None = None,
    *,
    inventory: Inventory | None = None,
    known_hosts: Path | str = DEFAULT_KNOWN_HOSTS,
) -> HostMemory:
    """RAM, smallest GPU memory and GPU count of `host` (an inventory name or
    [user@]host[:port]), read over SSH; raises SSHError when the host cannot say."""
    if executor is None:
        async with SSHExecutor(inventory, known_hosts) as own:
            return await detect_host_memory(host, own)
    row = check_from_result((await _gather(executor, {host: probe_script()}))[host])
    if row.error is not None or row.memory is None:
        raise SSHError(row.error or f"{host}: no memory figures in the probe's output")
    return row.memory
