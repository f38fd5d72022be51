"""`shoal dev-cluster`: N nodes on 127.0.0.1 with their own ports and data dirs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from node.cli.common import EXIT_FAILURE, console, fail


def dev_inventory(nodes: int, base_port: int) -> str:
    """The inventory `shoal dev-cluster` writes for its loopback nodes."""
    lines = ["cluster: {name: dev}", "hosts:"]
    for index in range(1, nodes + 1):
        lines.append(f"  dev-{index}: {{ssh_host: 127.0.0.1, p2p_port: {base_port + index - 1}}}")
    return "\n".join(lines) + "\n"


def dev_cluster(
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=64, help="How many nodes.")] = 3,
    base_port: Annotated[int, typer.Option("--base-port", help="Port of the first node.")] = 8770,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Parent of every node's data dir.")
    ] = Path(".shoal/dev"),
) -> None:
    """Start N nodes on 127.0.0.1 (own ports and data dirs); Ctrl-C stops them all."""
    data_dir.mkdir(parents=True, exist_ok=True)
    inventory = data_dir / "hosts.yaml"
    inventory.write_text(dev_inventory(nodes, base_port), encoding="utf-8")
    processes: list[subprocess.Popen[bytes]] = []

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        for index in range(1, nodes + 1):
            command = [
                sys.executable, "-m", "node", "serve",
                "--node-id", f"dev-{index}",
                "--port", str(base_port + index - 1),
                "--data-dir", str(data_dir / f"dev-{index}"),
                "--inventory", str(inventory),
            ]  # fmt: skip
            log_file = open(data_dir / f"dev-{index}.log", "ab")  # noqa: SIM115 - child owns it
            processes.append(
                subprocess.Popen(command, stdout=log_file, stderr=log_file)  # noqa: S603
            )
            log_file.close()
        for index in range(nodes):
            console.print(
                f"dev-{index + 1}: http://127.0.0.1:{base_port + index}  "
                f"(log {data_dir / f'dev-{index + 1}.log'})",
                highlight=False,
            )
        console.print("press Ctrl-C to stop every node", highlight=False)
        while all(process.poll() is None for process in processes):
            time.sleep(0.5)
        dead = [f"dev-{i + 1}" for i, p in enumerate(processes) if p.poll() is not None]
        fail(f"node(s) {', '.join(dead)} exited; see their logs in {data_dir}", EXIT_FAILURE)
    except KeyboardInterrupt:
        console.print("stopping...", highlight=False)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=12)
            except subprocess.TimeoutExpired:
                process.kill()


def register(app: typer.Typer) -> None:
    """Add `shoal dev-cluster` to the app."""
    app.command("dev-cluster")(dev_cluster)
