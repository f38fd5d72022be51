"""Metrics an operator runs a cluster from: series, shipped rules and dashboard, real Prometheus."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientError, ClientSession
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from config import load_settings
from health import BreakerRegistry
from node.daemon import NodeDaemon
from node.metrics import RuntimeCollector
from node.runtime import NodeRuntime
from tests.node.daemons import FAST_ELECTION, test_settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus" / "shoal-rules.yml"
DASHBOARD = ROOT / "config" / "grafana" / "shoal.json"
GPU_READING = {
    "index": 0,
    "name": "Fake GPU",
    "uuid": "GPU-0",
    "util_pct": 87.0,
    "memory_used_mb": 1024.0,
    "memory_total_mb": 81920.0,
    "temperature_c": 61.0,
    "power_watts": 310.0,
    "ecc_uncorrected": 0,
    "xid_errors": 2,
}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package prometheus; .ci/sysdeps.sh installs it)"
        if os.environ.get("SHOAL_REQUIRE_NETNS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def _series_names(text: str) -> set[str]:
    """Every sample name a scrape can hold, also of families that have no sample yet."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count"))
        names.update(sample.name for sample in family.samples)
    return names


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await check():
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def _get_text(url: str) -> tuple[int, str]:
    async with ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def _gpu_scrape(tmp_path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    settings = load_settings(env={}, flags={"data_dir": tmp_path, "node_id": "g"}).settings
    runtime = NodeRuntime(settings, "g", "127.0.0.1", "0", BreakerRegistry())
    runtime.gpus = lambda: [GPU_READING]
    registry = CollectorRegistry()
    registry.register(RuntimeCollector(runtime))
    return _samples(generate_latest(registry).decode())


def test_gpu_readings_become_base_unit_series(tmp_path: Path) -> None:
    samples = _gpu_scrape(tmp_path)
    gpu = (("gpu", "0"),)
    assert samples[("shoal_gpu_utilization_ratio", gpu)] == pytest.approx(0.87)
    assert samples[("shoal_gpu_memory_used_bytes", gpu)] == 1024 * 1024 * 1024
    assert samples[("shoal_gpu_memory_total_bytes", gpu)] == 81920 * 1024 * 1024
    assert samples[("shoal_gpu_temperature_celsius", gpu)] == 61.0
    assert samples[("shoal_gpu_power_watts", gpu)] == 310.0
    assert samples[("shoal_gpu_xid_errors_total", gpu)] == 2.0
    assert samples[("shoal_gpu_ecc_uncorrected_errors_total", gpu)] == 0.0


async def test_a_node_exports_membership_election_and_http_series(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "solo", **FAST_ELECTION)) as daemon:
        base = f"http://127.0.0.1:{daemon.port}"
        assert (await _get_text(base + "/v1/records/games/status"))[0] == 200
        assert (await _get_text(base + "/v1/no/such/route"))[0] == 404

        async def coordinating() -> bool:
            _, text = await _get_text(base + "/metrics")
            return _samples(text).get(("shoal_coordinator", ())) == 1.0

        await _until(coordinating, 10, "the lone node to report itself coordinator")
        _, text = await _get_text(base + "/metrics")
    samples = _samples(text)
    assert samples[("shoal_members", (("state", "alive"),))] == 1.0
    assert samples[("shoal_members", (("state", "dead"),))] == 0.0
    assert samples[("shoal_election_term", ())] >= 1.0
    assert samples[("shoal_plan_version", ())] >= 1.0
    assert samples[("shoal_jobs", (("state", "running"),))] == 0.0
    assert samples[("shoal_jobs", (("state", "lost"),))] == 0.0
    route = (("method", "GET"), ("route", "/v1/records/{store}/status"), ("status", "200"))
    assert samples[("shoal_http_requests_total", route)] == 1.0
    unmatched = (("method", "GET"), ("route", "unmatched"), ("status", "404"))
    assert samples[("shoal_http_requests_total", unmatched)] == 1.0
    names = {name for name, _ in samples}
    assert "shoal_http_request_duration_seconds_bucket" in names
    assert not [name for name in names if "/" in name or "no_such" in name]


def test_alerting_rules_pass_promtool() -> None:
    result = subprocess.run(
        [_tool("promtool"), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


async def test_dashboard_and_rules_use_only_series_a_node_exports(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "solo")) as daemon:
        _, text = await _get_text(f"http://127.0.0.1:{daemon.port}/metrics")
    exported = _series_names(text) | {name for name, _ in _gpu_scrape(tmp_path / "gpu")}
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions.append(RULES.read_text())
    used = {name for text in expressions for name in re.findall(r"\bshoal_[a-z_]+", text)}
    assert used, "the dashboard and rules query shoal series"
    assert used <= exported, f"not exported by a node: {sorted(used - exported)}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    async with (
        ClientSession() as session,
        session.get(f"{prometheus}/api/v1/query", params={"query": expr}) as response,
    ):
        document = await response.json()
    assert document["status"] == "success", document
    result: list[dict[str, Any]] = document["data"]["result"]
    return result


async def test_real_prometheus_scrapes_a_three_node_cluster(tmp_path: Path) -> None:
    binary = _tool("prometheus")
    names = ["p1", "p2", "p3"]
    daemons: list[NodeDaemon] = []
    process: subprocess.Popen[bytes] | None = None
    try:
        for name in names:
            seeds = (f"127.0.0.1:{daemons[0].port}",) if daemons else ()
            settings = test_settings(
                tmp_path, name, voters=tuple(names), seeds=seeds, **FAST_ELECTION
            )
            daemon = NodeDaemon(settings)
            await daemon.start()
            daemons.append(daemon)
        targets = ", ".join(f"'127.0.0.1:{d.port}'" for d in daemons)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{RULES}']\n"
            "scrape_configs:\n  - job_name: shoal\n"
            f"    static_configs: [{{targets: [{targets}]}}]\n"
        )
        port = _free_port()
        with (tmp_path / "prometheus.log").open("wb") as log:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        prometheus = f"http://127.0.0.1:{port}"

        async def all_alive_everywhere() -> bool:
            try:
                result = await _query(prometheus, 'shoal_members{state="alive"}')
            except (OSError, ClientError):  # not listening, or not ready yet (503)
                return False
            return len(result) == 3 and all(float(r["value"][1]) == 3 for r in result)

        waited = await _until(all_alive_everywhere, 60, "Prometheus to see 3 alive members x3")
        print(f"Prometheus saw 3 nodes with 3 alive members each after {waited:.1f} s")

        async def one_coordinator_one_term() -> bool:
            coordinators = await _query(prometheus, "sum(shoal_coordinator)")
            lowest_term = await _query(prometheus, "min(shoal_election_term)")
            return (
                bool(coordinators)
                and float(coordinators[0]["value"][1]) == 1
                and bool(lowest_term)
                and float(lowest_term[0]["value"][1]) >= 1
            )

        await _until(one_coordinator_one_term, 60, "one coordinator and a term in Prometheus")
        up = await _query(prometheus, 'up{job="shoal"}')
        assert sorted(float(r["value"][1]) for r in up) == [1.0, 1.0, 1.0]
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for daemon in reversed(daemons):
            await daemon.close()
