"""cluster_monitor against a real local cluster: in-process NodeDaemons on 127.0.0.1, port 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from config import NodeSettings, load_settings
from health import MONITOR_FLAGS, ClusterMonitor, ClusterStatus, MonitorError, MonitorOptions
from health.cluster_monitor import main, parse_args
from node import NodeDaemon

FAST = {
    "timeouts.probe_interval_s": 0.1,
    "timeouts.probe_timeout_s": 0.05,
    "timeouts.indirect_probe_timeout_s": 0.1,
    "timeouts.suspicion_s": 0.3,
}
ROOT = Path(__file__).resolve().parents[2]
SECRET = "monitor-test-secret-0123456789abcdef"


def _settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    base = {
        "data_dir": tmp_path / name,
        "node_id": name,
        "port": 0,
        "mdns": False,
        "cluster_name": f"mon{os.getpid()}",
        **FAST,
    }
    return load_settings(env={}, flags={**base, **flags}).settings


def _secret_file(path: Path, text: str = SECRET) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def _url(daemon: NodeDaemon) -> str:
    return f"http://127.0.0.1:{daemon.port}"


async def _wait_for(monitor: ClusterMonitor, ready: Any, timeout_s: float = 10.0) -> ClusterStatus:
    deadline = time.monotonic() + timeout_s
    status = await monitor.get_cluster_status()
    while not ready(status):
        if time.monotonic() > deadline:
            pytest.fail(f"cluster never got ready: {json.dumps(status.to_dict())}")
        await asyncio.sleep(0.05)
        status = await monitor.get_cluster_status()
    return status


@contextlib.asynccontextmanager
async def _cluster(tmp_path: Path, n: int = 3, **flags: Any) -> AsyncIterator[list[NodeDaemon]]:
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(NodeDaemon(_settings(tmp_path, "n0", **flags)))
        daemons = [first]
        for index in range(1, n):
            settings = _settings(tmp_path, f"n{index}", seeds=(f"127.0.0.1:{first.port}",), **flags)
            daemons.append(await stack.enter_async_context(NodeDaemon(settings)))
        yield daemons


def _all_alive(n: int) -> Any:
    def ready(status: ClusterStatus) -> bool:
        return len(status.nodes) == n and status.ok

    return ready


@contextlib.contextmanager
def _silent_port() -> Iterator[int]:
    """A port that accepts connections (backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "health.cluster_monitor", *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "SHOAL_CONFIG": "", **(env or {})},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_learns_the_cluster_from_one_node_and_exits_0_when_all_are_well(
    tmp_path: Path,
) -> None:
    async with _cluster(tmp_path) as daemons:
        async with ClusterMonitor(nodes=[_url(daemons[0])], timeout_s=2.0) as monitor:
            status = await _wait_for(monitor, _all_alive(3))
        assert [row.node_id for row in status.nodes] == ["n0", "n1", "n2"]
        assert {row.port for row in status.nodes} == {d.port for d in daemons}
        assert all(row.health == "healthy" and row.error is None for row in status.nodes)
        assert status.summary.nodes_alive == 3
        for _ in range(5):  # a node starved of CPU (a loaded test machine) is rightly degraded
            code, out, err = await _run_cli("--node", _url(daemons[1]), "--json")
            document = json.loads(out)
            assert code == (0 if document["summary"]["ok"] else 1), out + err
            if code == 0:
                break
            await asyncio.sleep(2.0)
        assert code == 0, out + err
        assert set(document) == {"time", "coordinator", "term", "nodes", "summary"}
        assert [node["node_id"] for node in document["nodes"]] == ["n0", "n1", "n2"]
        assert {node["state"] for node in document["nodes"]} == {"alive"}
        assert all(node["wal_pending"] == 0 for node in document["nodes"])
        assert document["summary"]["ok"] is True
        code, once, err = await _run_cli("--node", _url(daemons[1]), "--json", "--once")
        assert code == 0, err
        assert set(json.loads(once)) == set(document)  # --once is the one status, said aloud


async def test_inventory_mode_asks_every_host(tmp_path: Path) -> None:
    async with _cluster(tmp_path, 2) as daemons:
        inventory = tmp_path / "hosts.yaml"
        lines = ["hosts:"] + [
            f"  n{i}: {{ssh_host: 127.0.0.1, p2p_port: {d.port}}}" for i, d in enumerate(daemons)
        ]
        inventory.write_text("\n".join(lines) + f"\n  n9: {{ssh_host: 127.0.0.1, p2p_port: "
                             f"{_closed_port()}}}\n")  # fmt: skip
        code, out, err = await _run_cli("--inventory", str(inventory), "--json")
        assert code == 1, err
        nodes = {node["node_id"]: node for node in json.loads(out)["nodes"]}
        assert sorted(nodes) == ["n0", "n1", "n9"]
        assert nodes["n9"]["error"] == "unreachable: connection refused"
        assert nodes["n9"]["state"] == "unknown"
        assert nodes["n0"]["error"] is None
        async with ClusterMonitor(inventory=inventory, timeout_s=1.0) as monitor:
            status = await monitor.get_cluster_status()
        assert [row.node_id for row in status.nodes] == ["n0", "n1", "n9"]


class _SilentServers:
    """Servers that accept connections and never answer; they count how many connections are
    open at once across all of them."""

    def __init__(self) -> None:
        self.open = 0
        self.max_open = 0
        self.servers: list[asyncio.Server] = []
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, n: int) -> list[int]:
        for _ in range(n):
            self.servers.append(await asyncio.start_server(self._hold, "127.0.0.1", 0))
        return [int(server.sockets[0].getsockname()[1]) for server in self.servers]

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        self.writers.add(writer)
        try:
            await reader.read()  # until the client gives up and closes
        finally:
            self.open -= 1
            self.writers.discard(writer)
            writer.close()

    async def close(self) -> None:
        for writer in list(self.writers):
            writer.close()
        for server in self.servers:
            server.close()
            await server.wait_closed()


async def test_unreachable_and_silent_nodes_are_rows_and_do_not_stall(tmp_path: Path) -> None:
    """Every node is asked at once: four silent nodes hold four connections open together (a
    monitor asking one node after another holds one), and each becomes a timeout row."""
    silent = _SilentServers()
    async with _cluster(tmp_path, 1) as daemons:
        ports = await silent.start(4)
        try:
            refused = _closed_port()
            urls = [_url(daemons[0]), f"127.0.0.1:{refused}"]
            urls += [f"127.0.0.1:{port}" for port in ports]
            async with ClusterMonitor(nodes=urls, timeout_s=0.5) as monitor:
                started = time.monotonic()
                status = await monitor.get_cluster_status()
                elapsed = time.monotonic() - started
        finally:
            await silent.close()
    print(f"status of 6 nodes (4 silent, timeout 0.5 s) took {elapsed:.2f} s")
    assert silent.max_open >= 4, f"silent nodes asked at once: at most {silent.max_open}"
    assert elapsed < 30, "liveness: the monitor must not hang on silent nodes"
    rows = {row.node_id: row for row in status.nodes}
    assert rows["n0"].error is None
    assert rows[f"127.0.0.1:{refused}"].error == "unreachable: connection refused"
    for port in ports:
        assert rows[f"127.0.0.1:{port}"].error == "timeout after 0.5 s"
    assert status.exit_code == 1


async def test_secret_mismatch_is_a_401_row_and_the_right_secret_works(tmp_path: Path) -> None:
    secret = _secret_file(tmp_path / "secret")
    async with _cluster(tmp_path, 2, secret_file=secret) as daemons:
        url = _url(daemons[0])
        async with ClusterMonitor(nodes=[url], secret=SECRET.encode()) as monitor:
            good = await _wait_for(monitor, _all_alive(2))
        assert [row.node_id for row in good.nodes] == ["n0", "n1"]
        wrong = b"another-secret-of-enough-length!"
        async with ClusterMonitor(nodes=[url], secret=wrong) as monitor:
            bad = await monitor.get_cluster_status()
        assert [row.error for row in bad.nodes] == ["401: bad signature"]
        assert bad.exit_code == 1
        async with ClusterMonitor(nodes=[url]) as monitor:
            unsigned = await monitor.get_cluster_status()
        assert unsigned.nodes[0].error is not None
        assert unsigned.nodes[0].error.startswith("401: missing signature headers")
        wrong_file = _secret_file(tmp_path / "wrong", wrong.decode())
        code, out, _ = await _run_cli("--node", url, "--secret-file", str(wrong_file))
        assert code == 1
        assert "401: bad signature" in out
        code, out, _ = await _run_cli("--node", url, "--secret-file", str(secret), "--json")
        assert code == 0
        assert len(json.loads(out)["nodes"]) == 2


async def test_watch_yields_refreshes_and_reports_a_node_that_went(tmp_path: Path) -> None:
    async with _cluster(tmp_path, 2) as daemons:
        async with ClusterMonitor(nodes=[_url(daemons[0])], timeout_s=1.0) as monitor:
            await _wait_for(monitor, _all_alive(2))
            seen: list[ClusterStatus] = []
            async for status in monitor.watch(0.05):
                seen.append(status)
                row = status.node("n1")
                if len(seen) == 1:
                    await daemons[1].close()  # leaves: gone on purpose, not a failure
                elif row is not None and row.state == "left" and row.error is not None:
                    break
                assert len(seen) < 100
        assert row is not None
        assert row.error == "unreachable: connection refused"
        assert seen[-1].ok
        assert seen[-1].recent_failures == ()
        assert seen[-1].summary.nodes_left == 1


async def test_a_closed_monitor_refuses_reuse() -> None:
    monitor = ClusterMonitor(nodes=[f"127.0.0.1:{_closed_port()}"], timeout_s=0.5)
    async with monitor:
        status = await monitor.get_cluster_status()
    assert status.nodes[0].error == "unreachable: connection refused"
    await monitor.close()
    with pytest.raises(MonitorError, match="closed"):
        await monitor.get_cluster_status()
    with pytest.raises(MonitorError, match="not a node URL"):
        ClusterMonitor(nodes=["ftp://x"])


async def test_watch_json_is_ndjson_and_sigint_exits_0(tmp_path: Path) -> None:
    async with _cluster(tmp_path, 1) as daemons:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "health.cluster_monitor", "--node", _url(daemons[0]),
            "--watch", "--json", "--interval", "0.1",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            lines = [await asyncio.wait_for(process.stdout.readline(), 10) for _ in range(3)]
            process.send_signal(2)
            rest, err = await asyncio.wait_for(process.communicate(), 10)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0, err
    assert b"Traceback" not in err
    documents = [json.loads(line) for line in lines + rest.splitlines() if line.strip()]
    assert len(documents) >= 3
    assert all(len(document["nodes"]) == 1 for document in documents)
    assert documents[1]["time"] > documents[0]["time"]


async def test_watch_on_a_pipe_writes_plain_tables(tmp_path: Path) -> None:
    async with _cluster(tmp_path, 1) as daemons:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "health.cluster_monitor", "--node", _url(daemons[0]),
            "--watch", "--interval", "0.1",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            text = b""
            while text.count(b"recent failures") < 2:
                text += await asyncio.wait_for(process.stdout.readline(), 10)
            process.terminate()
            rest, _ = await asyncio.wait_for(process.communicate(), 10)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0
    output = (text + rest).decode()
    assert "\x1b" not in output
    assert output.count("node ") >= 2  # one full table per refresh
    assert "n0" in output


def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    loose = tmp_path / "loose"
    loose.write_text(SECRET)
    loose.chmod(0o644)
    bad_inventory = tmp_path / "bad.yaml"
    bad_inventory.write_text("hosts: [1, 2\n")
    cases = [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--interval", "zero"], "--interval: invalid float value"),
        (["--watch", "--interval", "0"], "--interval must be positive"),
        (["--once", "--watch"], "--once and --watch exclude each other"),
        (["--timeout", "-1"], "--timeout must be positive"),
        (["--node", "ftp://x"], "--node: not a node URL"),
        (["--inventory", str(tmp_path / "missing.yaml")], "inventory not found"),
        (["--inventory", str(bad_inventory)], "bad.yaml"),
        (["--secret-file", str(loose)], "readable by group or others"),
        (["--secret-file", str(tmp_path / "none")], "secret file not found"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("cluster_monitor: error: "), err
        assert message in err
        assert "Traceback" not in err


def test_default_is_the_local_node_from_the_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _closed_port()
    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    monkeypatch.setenv("SHOAL_P2P_PORT", str(port))
    assert main(["--json", "--timeout", "1"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert [(n["address"], n["port"], n["error"]) for n in document["nodes"]] == [
        ("127.0.0.1", port, "unreachable: connection refused")
    ]


def test_shoal_monitor_command_runs_the_same_program(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import typer

    from node.cli.monitor import register

    monkeypatch.delenv("SHOAL_CONFIG", raising=False)
    app = typer.Typer()
    register(app)
    app.command("version")(lambda: None)  # a second command keeps `monitor` a subcommand
    port = _closed_port()
    with pytest.raises(SystemExit) as exit_info:
        app(["monitor", "--node", f"127.0.0.1:{port}", "--json", "--timeout", "1"])
    assert exit_info.value.code == 1
    assert json.loads(capsys.readouterr().out)["nodes"][0]["port"] == port
    with pytest.raises(SystemExit) as exit_info:
        app(["monitor", "--interval", "0"])
    assert exit_info.value.code == 2
    assert "--interval must be positive" in capsys.readouterr().err


def _argv_setting_every_flag() -> tuple[list[str], MonitorOptions]:
    """A command line giving every flag of MONITOR_FLAGS a value other than its default."""
    samples: dict[type, list[Any]] = {
        str: ["http://a:1", "http://b:2"],
        Path: [Path("/x/hosts.yaml")],
        float: [0.25],
    }
    argv: list[str] = []
    expected: dict[str, Any] = {}
    for flag in MONITOR_FLAGS:
        if flag.kind is bool:
            argv.append(flag.flag)
            expected[flag.field] = True
            continue
        values = samples[flag.kind] if flag.repeatable else samples[flag.kind][:1]
        for value in values:
            argv += [flag.flag, str(value)]
        expected[flag.field] = tuple(values) if flag.repeatable else values[0]
    return argv, MonitorOptions(**expected)


def test_both_command_lines_are_built_from_one_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    from node.cli import monitor as shoal_monitor

    assert {flag.field for flag in MONITOR_FLAGS} == {f.name for f in fields(MonitorOptions)}
    argv, expected = _argv_setting_every_flag()
    assert all(getattr(expected, f.name) != f.default for f in fields(MonitorOptions))
    assert parse_args(argv) == expected
    assert parse_args([]) == MonitorOptions()
    seen: list[MonitorOptions] = []

    def record(options: MonitorOptions) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(shoal_monitor, "run_monitor", record)
    app = typer.Typer()
    shoal_monitor.register(app)
    app.command("version")(lambda: None)  # a second command keeps `monitor` a subcommand
    for args in (argv, []):
        with pytest.raises(SystemExit) as exit_info:
            app(["monitor", *args])
        assert exit_info.value.code == 0
    assert seen == [expected, MonitorOptions()]
