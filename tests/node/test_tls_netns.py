"""On netns hosts, a packet socket on the bridge captures every frame between an operator and a
node while a record holding a 64-byte marker is ingested and read back, a file holding it is
fetched, and a job prints it: with `auth: tls` the marker is in no frame; with `auth: hmac` (the
control, same steps) it is, so the capture does see the traffic."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from config import signing_middleware
from tests.cluster import Host, NetnsClusterFactory
from tests.cluster.sshd import run_in_namespace
from tests.node.tls_pki import Pki, make_pki

pytestmark = pytest.mark.netns

SECRET = b"tls-netns-capture-secret-0123456789ab"
ETH_P_ALL = 0x0003
_CLONE_NEWNET = 0x40000000


class Capture:
    """Every frame on every interface of a namespace (the switch: both bridge ports), read by
    an AF_PACKET socket in a thread; `count` frames seen, `hits` frames holding `needle`."""

    def __init__(self, ns: str, needle: bytes) -> None:
        self.ns = ns
        self.needle = needle
        self.count = 0
        self.hits = 0
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"capture {ns}", daemon=True)

    def _run(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/var/run/netns/{self.ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {self.ns}")
            finally:
                os.close(fd)
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)) as raw:
                raw.settimeout(0.1)
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
                self.ready.set()
                while not self._stop.is_set():
                    try:
                        frame = raw.recv(65536)
                    except TimeoutError:
                        continue
                    self.count += 1
                    if self.needle in frame:
                        self.hits += 1
        except BaseException as exc:
            self._error = exc
            self.ready.set()

    @contextlib.contextmanager
    def running(self) -> Iterator[Capture]:
        self._thread.start()
        assert self.ready.wait(10), "the capture did not start"
        if self._error is not None:
            raise self._error
        try:
            yield self
        finally:
            time.sleep(0.2)  # frames in flight when the steps ended
            self._stop.set()
            self._thread.join(10)
        if self._error is not None:
            raise self._error


def _start_node(host: Host, pki: Pki, marker: str, tls: bool) -> None:
    secret = host.data_dir / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    models = host.data_dir / "data" / "models"
    models.mkdir(parents=True)
    (models / "marked.txt").write_text(f"head {marker} tail\n")
    config: dict[str, Any] = {
        "node_id": "a",
        "data_dir": str(host.data_dir / "data"),
        "bind": host.address,
        "port": host.port,
        "mdns": False,
        "secret_file": str(secret),
        "sync_interval_s": 0,
    }
    if tls:
        config["tls"] = pki.node_tls("a")
    path = host.data_dir / "shoal.yaml"
    path.write_text(yaml.safe_dump(config))
    host.spawn([sys.executable, "-m", "node.cli", "serve", "--config", str(path)], name="shoal")


def _client(pki: Pki) -> ssl.SSLContext:
    context = pki.client("alice")
    context.check_hostname = False
    return context


async def _steps(base: str, pki: Pki, marker: str, tls: bool) -> dict[str, Any]:
    """Ingest and read back a record, fetch the file, run a job printing the marker and read
    its log; answer what the client saw (so the test knows the marker did travel)."""
    kwargs: dict[str, Any] = (
        {"connector": aiohttp.TCPConnector(ssl=_client(pki))}
        if tls
        else {"middlewares": (signing_middleware(SECRET, "cli-capture"),)}
    )
    seen: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20), **kwargs) as s:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with s.get(f"{base}/v1/health") as response:
                    if response.status == 200:
                        break
            assert time.monotonic() < deadline, "the node did not answer"
            await asyncio.sleep(0.2)
        record = {
            "game_id": "g-marker",
            "created_at": time.time(),
            "board_type": "hex8",
            "num_players": 2,
            "winner": 1,
            "moves": [marker],
        }
        async with s.post(f"{base}/v1/records/games", json=[record]) as response:
            assert response.status == 200, await response.text()
        async with s.get(f"{base}/v1/records/games/get", params={"key": "g-marker"}) as response:
            seen["record"] = marker in await response.text()
        while True:
            async with s.get(
                f"{base}/v1/sync/models/file", params={"path": "marked.txt"}
            ) as response:
                if response.status == 200:
                    seen["file"] = marker in await response.text()
                    break
            assert time.monotonic() < deadline, f"file not served: {response.status}"
            await asyncio.sleep(0.2)
        job = {"name": "marker", "argv": ["echo", marker]}
        async with s.post(f"{base}/v1/jobs", json=job) as response:
            assert response.status in (200, 201), await response.text()
            job_id = (await response.json())["job_id"]
        async with s.get(f"{base}/v1/jobs/{job_id}/wait", params={"timeout_s": "20"}) as response:
            assert response.status == 200
        async with s.get(f"{base}/v1/jobs/{job_id}/logs") as response:
            seen["job"] = marker in await response.text()
    return seen


async def _plain_status(base: str) -> int:
    """The status of a signed plain-HTTP GET /v1/status (0: the connection was dropped)."""
    middlewares = (signing_middleware(SECRET, "cli-local"),)
    async with aiohttp.ClientSession(middlewares=middlewares) as session:
        try:
            async with session.get(f"{base}/v1/status") as response:
                return response.status
        except aiohttp.ClientError:
            return 0


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "hmac-control"])
def test_the_marker_never_crosses_the_bridge_in_clear(
    netns_cluster: NetnsClusterFactory, tmp_path: Path, tls: bool
) -> None:
    cluster = netns_cluster(2)
    node, operator = cluster.hosts
    pki = make_pki(tmp_path / "pki", nodes=("a",))
    marker = secrets.token_hex(32)
    assert len(marker) == 64
    _start_node(node, pki, marker, tls)
    scheme = "https" if tls else "http"
    base = f"{scheme}://{node.address}:{node.port}"
    capture = Capture(cluster.switch_ns, marker.encode())
    with capture.running():
        seen = run_in_namespace(operator.ns, lambda: _steps(base, pki, marker, tls), 90)
    assert seen == {"record": True, "file": True, "job": True}
    assert capture.count > 20, "the capture saw (almost) no frames"
    if tls:
        assert capture.hits == 0, f"the marker crossed the bridge in {capture.hits} frames"
        # signed plain HTTP: served from the node's own host (its jobs, its CLI), at its own
        # address too, refused from another host
        plain = f"http://{node.address}:{node.port}"
        assert run_in_namespace(node.ns, lambda: _plain_status(plain), 30) == 200
        assert run_in_namespace(operator.ns, lambda: _plain_status(plain), 30) == 400
    else:
        assert capture.hits >= 3, "the control run should show the marker in clear"
