"""`shoal rl demo`: a local cluster (one trainer, generators on the other nodes), or running
daemons given with --node, running the pipeline-RL example of node.rl.demo; one JSON line per
step, then a final line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from net import BlockingPeerClient, PeerRequestError, peer_url, split_url
from node.cli.common import fail
from node.cli.devcluster import dev_gpus, host_gpu_count

RUN = "demo"
rl_app = typer.Typer(help="Pipeline RL: in-flight weight updates, stamped rollouts, bounded lag.")


def _inventory(nodes: int, base_port: int) -> str:
    lines = ["cluster: {name: rl-demo, voters: [rl-1]}", "hosts:"]
    for index in range(1, nodes + 1):
        role = "training" if index == 1 else "selfplay"
        port = base_port + index - 1
        lines.append(f"  rl-{index}: {{ssh_host: 127.0.0.1, p2p_port: {port}, role: {role}}}")
    return "\n".join(lines) + "\n"


def _get(url: str) -> Any:
    base, path_qs = split_url(url)
    try:
        return BlockingPeerClient().call_json("GET", base, path_qs, timeout_s=5.0)[1]
    except PeerRequestError:
        return None


def _wait_for_group(url: str, nodes: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group = _get(f"{url}/v1/rendezvous?group=weights&run={RUN}")
        if isinstance(group, dict) and len(group.get("members", [])) == nodes:
            return
        time.sleep(0.5)
    fail(f"the {nodes} demo nodes formed no weights group in {timeout_s:.0f} s")


def demo_node_config(index: int, nodes: int, visible: int) -> str:
    """The config file of demo node `index` (0-based; 0 trains) of `nodes` on a host with
    `visible` GPUs: its role, gloo, one training process, and its share of the GPUs."""
    role = "training" if index == 0 else "selfplay"
    text = f"role: {role}\nbackend: gloo\nmax_training: 1\ntraining_nproc: 1\n"
    gpus = dev_gpus(index, nodes, visible)
    if gpus is not None:
        text += f"gpus: {'none' if gpus == 'none' else f'[{gpus}]'}\n"
    return text


def start_local_cluster(
    root: Path, nodes: int, base_port: int
) -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    """`nodes` daemons on 127.0.0.1 under `root` (rl-1 trains, the others self-play), each
    with its share of the host's GPUs (node.cli.devcluster.dev_gpus): their URLs by name and
    their processes (the caller stops them)."""
    (root / "hosts.yaml").write_text(_inventory(nodes, base_port))
    names = [f"rl-{i}" for i in range(1, nodes + 1)]
    urls = {name: peer_url("127.0.0.1", base_port + i) for i, name in enumerate(names)}
    daemons: list[subprocess.Popen[bytes]] = []
    visible = host_gpu_count()
    for index, name in enumerate(names):
        config = root / f"{name}.yaml"
        config.write_text(demo_node_config(index, nodes, visible))
        command = [sys.executable, "-m", "node", "serve", "--node-id", name,
                   "--port", str(base_port + index), "--data-dir", str(root / name),
                   "--inventory", str(root / "hosts.yaml"), "--config", str(config)]  # fmt: skip
        with (root / f"{name}.log").open("ab") as log:
            daemons.append(subprocess.Popen(command, stdout=log, stderr=log))  # noqa: S603
    return urls, daemons


def _group_of(urls: list[str], timeout_s: float) -> dict[str, str]:
    """The given daemons by node id, the trainer (weights rank 0) first, once every one is in
    the weights group of the demo run."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = {url: _get(f"{url}/v1/rendezvous?group=weights&run={RUN}") for url in urls}
        ranks = {
            url: (group["rank"], group["members"][group["rank"]])
            for url, group in seen.items()
            if isinstance(group, dict) and isinstance(group.get("rank"), int)
        }
        if len(ranks) == len(urls) and any(rank == 0 for rank, _ in ranks.values()):
            ordered = sorted(ranks.items(), key=lambda item: item[1][0])
            return {name: url for url, (_, name) in ordered}
        time.sleep(0.5)
    missing = [url for url in urls if not isinstance((seen.get(url) or {}).get("rank"), int)]
    fail(
        f"not in the weights group of run {RUN!r} after {timeout_s:.0f} s: "
        f"{', '.join(missing) or 'no trainer (rank 0) among the nodes'}; give one training "
        "node and inference/selfplay nodes of one cluster"
    )


@rl_app.command("demo")
def demo(
    nodes: Annotated[
        int, typer.Option("--nodes", min=2, help="Nodes: 1 trainer + generators.")
    ] = 3,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps.")] = 30,
    max_lag: Annotated[int, typer.Option("--max-lag", min=0, help="Policy versions.")] = 2,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 64,
    kill_receiver_at: Annotated[
        int | None,
        typer.Option("--kill-receiver-at", help="SIGKILL one generator at this step, restart it."),
    ] = None,
    base_port: Annotated[int, typer.Option("--base-port", help="First node's port.")] = 8870,
    node_urls: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            help="Use this running daemon instead of a local cluster (repeat: one training "
            "node, the others inference/selfplay); the trainer and generators run here. "
            "SHOAL_SECRET_FILE signs their requests.",
        ),
    ] = None,
    wait_s: Annotated[
        float, typer.Option("--wait-s", min=0, help="Seconds the nodes get to form the group.")
    ] = 90.0,
    as_json: Annotated[bool, typer.Option("--json", help="Only the JSON lines.")] = False,
) -> None:
    """Train a toy policy with in-flight weight updates on a local cluster (or the nodes given
    with --node), printing JSON lines {step, version, samples, dropped_stale, max_lag_seen,
    reward_mean, broadcast_ms}, then {final_version, weights_sha256, weights_digest}
    (weights_sha256 is null where the weights' digest is not sha256, e.g. on GPUs)."""
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    from node.rl.demo import train

    demo = _Demo(Path(tempfile.mkdtemp(prefix="shoal-rl-demo-")), max_lag, as_json)
    try:
        demo.form(node_urls, nodes, base_port, wait_s)
        for name in demo.names[1:]:
            demo.start_generator(name)

        def before_step(step: int) -> None:
            if kill_receiver_at == step and len(demo.names) > 1:
                demo.restart_generator(step, demo.names[-1])

        def line(record: dict[str, Any]) -> None:
            print(json.dumps(record), flush=True)

        trainer = demo.names[0]
        final = train(
            RUN,
            demo.urls[trainer],
            [demo.urls[n] for n in demo.names],
            demo.models[trainer],
            steps,
            max_lag,
            batch_size,
            line,
            before_step,
        )
        time.sleep(1.0)  # the last acknowledgements are in; read every node's status
        print(json.dumps(demo.final_line(final)), flush=True)
    finally:
        demo.stop()


class _Demo:
    """The processes of one `shoal rl demo`: the local daemons it started (none with --node)
    and one generator per inference node, each logging into `root`."""

    def __init__(self, root: Path, max_lag: int, as_json: bool) -> None:
        self.root = root
        self.max_lag = max_lag
        self.as_json = as_json
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.generators: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        self.models: dict[str, Path] = {}

    @property
    def names(self) -> list[str]:
        return list(self.urls)

    def say(self, text: str) -> None:
        if not self.as_json:
            print(text, file=sys.stderr, flush=True)

    def form(self, node_urls: list[str] | None, nodes: int, base_port: int, wait_s: float) -> None:
        """Use the given daemons, or start a local cluster; wait for the weights group."""
        if node_urls:
            given = [url.rstrip("/") for url in node_urls]
            if len(set(given)) < 2:
                fail("give at least two --node URLs: one trainer and one generator")
            self.say(f"waiting for {len(given)} nodes to form the weights group of run {RUN!r}")
            self.urls = _group_of(given, wait_s)
            self.models = {name: self.root / "models" for name in self.urls}  # all run here
        else:
            self.urls, self.daemons = start_local_cluster(self.root, nodes, base_port)
            self.say(f"started {nodes} nodes under {self.root}; waiting for the role plan")
            _wait_for_group(next(iter(self.urls.values())), nodes, wait_s)
            self.models = {name: self.root / name / "models" for name in self.urls}

    def start_generator(self, name: str) -> None:
        with (self.root / f"{name}-generator.log").open("ab") as log:
            self.generators[name] = subprocess.Popen(  # noqa: S603 - our interpreter and arguments
                [sys.executable, "-m", "node", "rl", "generator", self.urls[name],
                 str(self.models[name]), "--max-lag", str(self.max_lag)],
                stdout=log, stderr=log,
            )  # fmt: skip

    def restart_generator(self, step: int, victim: str) -> None:
        self.say(f"step {step}: SIGKILL the generator of {victim}, then restart it")
        self.generators[victim].send_signal(signal.SIGKILL)
        self.generators[victim].wait()
        self.start_generator(victim)

    def final_line(self, final: int) -> dict[str, Any]:
        """The last line: the final version and every node's weights sha256 and digest."""
        statuses = {
            name: _get(f"{url}/v1/weights/status?run={RUN}") or {}
            for name, url in self.urls.items()
        }
        shas = {name: status.get("sha256") for name, status in statuses.items()}
        digests = {name: status.get("digest") for name, status in statuses.items()}
        return {"final_version": final, "weights_sha256": shas, "weights_digest": digests}

    def stop(self) -> None:
        """SIGTERM every process, then SIGKILL what is still up after 10 s."""
        processes = [*self.generators.values(), *self.daemons]
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@rl_app.command("generator", hidden=True)
def generator(
    daemon_url: str,
    models_dir: Path,
    max_lag: Annotated[int, typer.Option("--max-lag", min=0)] = 2,
) -> None:
    """One generator process of the demo (started by `shoal rl demo`)."""
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    from node.rl.demo import run_generator

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_generator(RUN, daemon_url, models_dir, max_lag, stop)


def register(app: typer.Typer) -> None:
    """Add `shoal rl` to the app."""
    app.add_typer(rl_app, name="rl")
