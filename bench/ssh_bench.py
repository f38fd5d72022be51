"""SSH executor across real hosts: 16 network-namespace hosts each running OpenSSH's sshd, the
client in a seventeenth (needs root and openssh-server).

(a) run_parallel over the 16 hosts at concurrency 16 (fresh connections, then warm ones), total
    wall time vs the slowest single host run alone. Target: total <= 1.5x the slowest host.
(b) connection reuse: N commands in a row on one host through the pool vs a fresh connection
    per command (mean and p50 per command).
Prints JSON. Usage: sudo .venv/bin/python bench/ssh_bench.py [--hosts 16] [--repeat 20]
       [--command 'sleep 0.2']
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config import Timeouts, parse_inventory
from node.ssh import SSHExecutor
from tests.cluster.netns import NetnsCluster
from tests.cluster.sshd import make_client_key, run_in_namespace, start_sshd

RUN_TIMEOUT_S = 600.0


async def _bench(
    inventory: Any, known: Path, names: list[str], command: str, repeat: int
) -> dict[str, Any]:
    timeouts = Timeouts(ssh_connect_s=30.0)
    singles = {}
    for name in names:  # each host alone, connection included
        async with SSHExecutor(inventory, known, timeouts=timeouts) as executor:
            started = time.perf_counter()
            result = await executor.run(name, command)
            singles[name] = time.perf_counter() - started
            if not result.ok:
                raise RuntimeError(f"{name}: {result.error or result.stderr}")
    async with SSHExecutor(inventory, known, max_concurrency=16, timeouts=timeouts) as executor:
        started = time.perf_counter()
        cold = await executor.run_parallel(names, command)
        cold_s = time.perf_counter() - started
        started = time.perf_counter()
        warm = await executor.run_parallel(names, command)
        warm_s = time.perf_counter() - started
        connects = executor.pool.connects
    failed = [h for h, r in {**cold, **warm}.items() if not r.ok]
    slowest = max(singles.values())

    async def per_command(reuse: bool) -> list[float]:
        times = []
        async with SSHExecutor(inventory, known, reuse=reuse, timeouts=timeouts) as executor:
            for _ in range(repeat):
                started = time.perf_counter()
                result = await executor.run(names[0], "true")
                times.append(time.perf_counter() - started)
                if not result.ok:
                    raise RuntimeError(f"{names[0]}: {result.error}")
        return times

    pooled = await per_command(True)
    fresh = await per_command(False)
    return {
        "parallel": {
            "hosts": len(names),
            "concurrency": 16,
            "command": command,
            "slowest_single_host_s": round(slowest, 4),
            "median_single_host_s": round(statistics.median(singles.values()), 4),
            "cold_total_s": round(cold_s, 4),
            "warm_total_s": round(warm_s, 4),
            "cold_ratio_to_slowest": round(cold_s / slowest, 3),
            "target_ratio": 1.5,
            "connections_opened": connects,
            "failed_hosts": failed,
        },
        "reuse": {
            "commands": repeat,
            "pooled_mean_ms": round(statistics.mean(pooled) * 1000, 2),
            "pooled_p50_ms": round(statistics.median(pooled) * 1000, 2),
            "fresh_mean_ms": round(statistics.mean(fresh) * 1000, 2),
            "fresh_p50_ms": round(statistics.median(fresh) * 1000, 2),
            "speedup": round(statistics.mean(fresh) / statistics.mean(pooled), 2),
        },
    }


@contextmanager
def plain_root_shell(namespaces: list[str]) -> Iterator[None]:
    """Give root /bin/sh as its login shell inside the namespaces (through `ip netns exec`'s
    bind mount of /etc/netns/NS/passwd): this machine's root bash sources a .bashrc that runs
    `pyenv init`, ~0.3 s of CPU per SSH session, which would be measured instead of SSH."""
    made = []
    root = Path("/etc/netns")
    root_existed = root.is_dir()
    plain = [
        ":".join([*line.split(":")[:6], "/bin/sh"]) if line.startswith("root:") else line
        for line in Path("/etc/passwd").read_text().splitlines()
    ]
    try:
        for ns in namespaces:
            directory = root / ns
            directory.mkdir(parents=True, exist_ok=False)
            made.append(directory)
            (directory / "passwd").write_text("\n".join(plain) + "\n")
        yield
    finally:
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)
        if not root_existed:
            shutil.rmtree(root, ignore_errors=True)


def run(hosts: int, repeat: int, command: str, login_shell: bool) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="shoal-ssh-bench-") as tmp,
        NetnsCluster(hosts + 1, Path(tmp) / "cluster") as cluster,
    ):
        base = Path(tmp)
        client, *targets = cluster.hosts
        key = make_client_key(base / "client")
        namespaces = [h.ns for h in targets if h.ns is not None]
        shells = nullcontext() if login_shell else plain_root_shell(namespaces)
        with shells:
            servers = [
                start_sshd(base / f"sshd-{h.name}", [key.public_line], host=h) for h in targets
            ]
            known = base / "known_hosts"
            known.write_text("\n".join(s.known_hosts_line() for s in servers) + "\n")
            inventory = parse_inventory(
                {
                    "hosts": {
                        h.name: {
                            "ssh_host": h.address,
                            "ssh_user": "root",
                            "ssh_key": str(key.path),
                        }
                        for h in targets
                    }
                }
            )
            names = [h.name for h in targets]
            results = run_in_namespace(
                client.ns, lambda: _bench(inventory, known, names, command, repeat), RUN_TIMEOUT_S
            )
            cluster.kill_all()
    return {
        "bench": "ssh",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "root_login_shell": "as configured" if login_shell else "/bin/sh",
        **results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--command", default="sleep 0.2")
    parser.add_argument(
        "--login-shell",
        action="store_true",
        help="Keep root's configured login shell on the hosts (default: /bin/sh).",
    )
    args = parser.parse_args(argv)
    print(json.dumps(run(args.hosts, args.repeat, args.command, args.login_shell), indent=2))


if __name__ == "__main__":
    main()
