"""The training routes of one real daemon: a process's reports (signed as a `cli-` client, as
shoal.report posts them) show in GET /v1/training/node, GET /v1/training, /v1/status and
/metrics; bad bodies are refused with the field named; a restart request moves the group to a
new generation with its reason, counted and audited."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from node import NodeDaemon
from node.cli import app
from shoal._daemon import DaemonClient
from shoal.errors import DaemonAnswerError
from tests.cluster.cluster import free_port
from tests.cluster.waiting import async_wait_until
from tests.node.daemons import FAST_ELECTION, test_settings


def reports(generation: int, rank: int, *steps: int, **fields: Any) -> dict[str, Any]:
    return {
        "generation": generation,
        "rank": rank,
        "local_rank": 0,
        "world_size": 1,
        "pid": 4242,
        "reports": [
            {"step": s, "at": time.time(), "compute_s": 0.02, "scalars": {"loss": 0.5}}
            for s in steps
        ],
    } | fields


Call = Callable[..., Awaitable[Any]]


def caller(client: DaemonClient) -> tuple[Call, Callable[[], Awaitable[int | None]]]:
    """`call(method, path, body=None)` through `client` off the loop, and `generation()`: the
    generation of this node's rank, None while it has none."""

    def call(method: str, path: str, body: Any = None) -> Awaitable[Any]:
        return asyncio.to_thread(client.request, method, path, body)

    async def generation() -> int | None:
        answer = await call("GET", "/v1/rendezvous")
        return None if answer.get("rank") is None else answer.get("generation")

    return call, generation


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(b"s" * 32)
    path.chmod(0o600)
    return path


async def test_reports_show_everywhere_and_a_restart_request_restarts_the_group(
    tmp_path: Path, secret: Path
) -> None:
    settings = test_settings(
        tmp_path, "solo", **FAST_ELECTION, role="training", backend="gloo", secret_file=secret
    )
    async with NodeDaemon(settings) as daemon:
        client = DaemonClient.from_env(
            {
                "SHOAL_DAEMON_URL": f"http://127.0.0.1:{daemon.port}",
                "SHOAL_SECRET_FILE": str(secret),
            }
        )

        call, generation = caller(client)
        first = await async_wait_until(
            generation, 20, message="a plan with a rank", retry_on=(DaemonAnswerError,)
        )
        answer = await call("POST", "/v1/training/reports", reports(first, 0, 1, 2, 3))
        assert answer == {"accepted": 3, "generation": first}
        stale = await call("POST", "/v1/training/reports", reports(first - 1, 0, 9))
        assert stale["accepted"] == 0

        part = await call("GET", "/v1/training/node?history=1")
        assert [(r["rank"], r["step"]) for r in part["ranks"]] == [(0, 3)]
        assert part["reporting"] is True
        assert part["history"]["0"]["scalars"]["loss"] == [0.5]
        view = await call("GET", "/v1/training")
        assert (view["generation"], view["world_size"], view["hung"]) == (first, 1, False)
        assert view["ranks"][0]["node"] == "solo"
        assert view["history"] is None
        plotted = await call("GET", "/v1/training?history=1")
        assert plotted["history"]["0"]["scalars"]["loss"] == [0.5], "what a page plots"
        assert view["missing"] == []
        status = await call("GET", "/v1/status")
        assert status["training"] == {
            "generation": first,
            "ranks": 1,
            "step": 3,
            "steps_per_s": status["training"]["steps_per_s"],
        }
        assert daemon.runtime is not None
        assert daemon.runtime.metrics is not None
        metrics = daemon.runtime.metrics.render()[0].decode()
        assert 'shoal_training_step{rank="0"} 3.0' in metrics
        assert 'shoal_training_restarts_total{reason="hang"} 0.0' in metrics

        env = {"COLUMNS": "200", "SHOAL_SECRET_FILE": str(secret), "SHOAL_CONFIG": ""}
        node = ["--node", f"http://127.0.0.1:{daemon.port}"]
        shown = await asyncio.to_thread(CliRunner().invoke, app, ["training", *node], env=env)
        assert shown.exit_code == 0, shown.output
        assert f"generation {first}, world 1: advancing" in shown.output
        assert "loss=0.5" in shown.output
        printed = await asyncio.to_thread(
            CliRunner().invoke, app, ["training", *node, "--json"], env=env
        )
        assert json.loads(printed.output)["ranks"][0]["step"] == 3

        with pytest.raises(DaemonAnswerError) as bad:
            await call("POST", "/v1/training/reports", reports(first, 0, -1))
        assert (bad.value.status, "reports.0.step") == (400, bad.value.reason.split(":")[0])
        with pytest.raises(DaemonAnswerError) as query:
            await call("GET", "/v1/training?history=yes")
        assert query.value.status == 400

        restart = {"generation": first, "reason": "worker_exit", "detail": "rank 0 exited 3"}
        assert (await call("POST", "/v1/training/restart", restart))["accepted"] is True

        async def restarted() -> list[dict[str, Any]]:
            return list((await call("GET", "/v1/training"))["restarts"])

        [record] = await async_wait_until(restarted, 20, message="the restart recorded")
        assert (record["reason"], record["detail"]) == ("worker_exit", "rank 0 exited 3")
        assert record["generation"] > first
        assert await generation() == record["generation"]
        stale_request = await call("POST", "/v1/training/restart", restart)
        assert stale_request["accepted"] is False, "the generation it names is over"

        async def audited() -> list[dict[str, Any]]:
            return list((await call("GET", "/v1/audit?kind=training"))["entries"])

        [entry] = await async_wait_until(audited, 10, message="the restart audited")
        assert (entry["action"], entry["subject"]) == (
            "restart",
            f"generation {record['generation']}",
        )
        assert entry["detail"]["reason"] == "worker_exit"
        metrics = daemon.runtime.metrics.render()[0].decode()
        assert 'shoal_training_restarts_total{reason="worker_exit"} 1.0' in metrics
        client.close()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"reports": [{"step": 1, "at": 0.0, "scalars": {"": 1.0}}]}, "reports.0.scalars"),
        ({"world_size": 0}, "world_size"),
        ({"rank": "1"}, "rank"),
        ({"extra": 1}, "extra"),
    ],
)
async def test_bad_report_bodies_name_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    async with NodeDaemon(test_settings(tmp_path, "solo")) as daemon:
        client = DaemonClient(f"http://127.0.0.1:{daemon.port}")
        with pytest.raises(DaemonAnswerError) as refused:
            await asyncio.to_thread(
                client.request, "POST", "/v1/training/reports", reports(1, 0, 1) | change
            )
        client.close()
    assert refused.value.status == 400
    assert refused.value.reason.startswith(field), refused.value.reason


def test_shoal_training_exits_1_when_the_node_is_unreachable() -> None:
    env = {"SHOAL_CONFIG": "", "SHOAL_SECRET_FILE": ""}
    port = free_port()
    result = CliRunner().invoke(app, ["training", "--node", f"http://127.0.0.1:{port}"], env=env)
    assert result.exit_code == 1, result.output
    assert f"127.0.0.1:{port}" in result.output


async def test_a_rank_reporting_its_group_broken_moves_the_group_on_once(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "solo", **FAST_ELECTION, role="training", backend="gloo")
    async with NodeDaemon(settings) as daemon:
        client = DaemonClient(f"http://127.0.0.1:{daemon.port}")

        call, generation = caller(client)
        first = await async_wait_until(
            generation, 20, message="a plan with a rank", retry_on=(DaemonAnswerError,)
        )
        broken = reports(first, 0, broken="all_reduce failed: Connection reset by peer")
        assert (await call("POST", "/v1/training/reports", broken))["generation"] == first
        await call("POST", "/v1/training/reports", broken)  # the next rank's: one restart still

        async def moved() -> int | None:
            now = await generation()
            return now if now is not None and now > first else None

        second = await async_wait_until(moved, 20, message="a new generation")
        await asyncio.sleep(1.0)
        assert await generation() == second, "one restart for one broken generation"
        [restart] = (await call("GET", "/v1/training"))["restarts"]
        assert restart["reason"] == "worker_exit"
        assert "rank 0: all_reduce failed: Connection reset by peer" in restart["detail"]
        stale = await call("POST", "/v1/training/reports", broken)  # an older generation
        assert stale["generation"] == second
        await asyncio.sleep(1.0)
        assert await generation() == second
        client.close()
