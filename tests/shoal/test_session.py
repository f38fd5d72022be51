"""shoal's training session on the CPU: reports batched by a thread (kept while the daemon is
away, newest first, a refusal raised at the next report), compute time measured around
collectives and DDP's all-reduce, the group of one generation formed and closed, the
rendezvous read from torchrun's variables or the daemon's answer (a contract with
node.training.rendezvous)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from config import Timeouts
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.training.rendezvous import rendezvous_for
from shoal import session as session_module
from shoal.compute import CollectiveClock
from shoal.errors import DaemonAnswerError, DaemonUnreachableError, SessionError, ShoalError
from shoal.group import torch_modules
from shoal.place import RankPlace
from shoal.rendezvous import parse_rendezvous, rendezvous_from_env
from shoal.report import Reporter
from shoal.session import TrainingSession, training_session
from tests.cluster.cluster import free_port

PLACE = RankPlace(rank=3, local_rank=1, world_size=4, local_world_size=2, generation=7)


class FakeDaemon:
    """A DaemonClient stand-in: answers posts from `answers` (an exception is raised), keeps
    every body it took."""

    url = "http://fake"

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []
        self.posted = threading.Event()

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        answer = self.answers.pop(0) if self.answers else {"accepted": 0, "generation": 7}
        if isinstance(answer, Exception):
            raise answer
        self.bodies.append(body)
        self.posted.set()
        return answer

    def close(self) -> None:
        pass


def steps(bodies: list[dict[str, Any]]) -> list[int]:
    return [report["step"] for body in bodies for report in body["reports"]]


def test_reports_are_batched_with_the_ranks_place() -> None:
    daemon = FakeDaemon()
    failures: list[BaseException] = []
    reporter = Reporter(daemon, PLACE, interval_s=3600, on_failure=failures.append)  # type: ignore[arg-type]
    reporter.add(1, 0.5, {"loss": 2.0})
    reporter.add(2, None, {})
    reporter.flush()
    reporter.close()
    [body] = daemon.bodies
    assert {k: body[k] for k in ("generation", "rank", "local_rank", "world_size", "dropped")} == {
        "generation": 7,
        "rank": 3,
        "local_rank": 1,
        "world_size": 4,
        "dropped": 0,
    }
    assert [(r["step"], r["compute_s"], r["scalars"]) for r in body["reports"]] == [
        (1, 0.5, {"loss": 2.0}),
        (2, None, {}),
    ]
    assert failures == []


def test_an_unreachable_daemon_keeps_the_newest_reports_and_never_raises() -> None:
    away = DaemonUnreachableError("http://fake", "connection refused")
    busy = DaemonAnswerError("http://fake", 503, "unavailable", "starting")
    daemon = FakeDaemon(away, busy)
    failures: list[BaseException] = []
    reporter = Reporter(
        daemon,  # type: ignore[arg-type]
        PLACE,
        interval_s=3600,
        max_pending=4,
        on_failure=failures.append,
    )
    for step in range(3):
        reporter.add(step, None, {})
    reporter.flush()  # refused: kept
    for step in range(3, 6):
        reporter.add(step, None, {})
    reporter.flush()  # busy: kept, the oldest dropped
    reporter.flush()
    reporter.close()
    assert steps(daemon.bodies) == [2, 3, 4, 5]
    assert reporter.dropped == 2
    assert daemon.bodies[0]["dropped"] == 2, "the daemon is told how many were lost"
    assert failures == []


def test_a_refusal_is_a_failure_and_an_older_daemon_is_left_alone(caplog: Any) -> None:
    refused = DaemonAnswerError("http://fake", 401, "unauthorized", "bad signature")
    failures: list[BaseException] = []
    reporter = Reporter(FakeDaemon(refused), PLACE, interval_s=3600, on_failure=failures.append)  # type: ignore[arg-type]
    reporter.add(1, None, {})
    reporter.flush()
    reporter.close()
    [failure] = failures
    assert isinstance(failure, SessionError)
    assert failure.__cause__ is refused
    old = FakeDaemon(DaemonAnswerError("http://fake", 404, "not_found", "no route"))
    reporter = Reporter(old, PLACE, interval_s=3600, on_failure=failures.append)  # type: ignore[arg-type]
    reporter.add(1, None, {})
    reporter.flush()
    reporter.add(2, None, {})
    reporter.flush()
    reporter.close()
    assert old.bodies == [], "404: reports stop"
    assert len(failures) == 1, "...and nothing is raised"


def test_without_a_daemon_reports_are_dropped_after_one_warning(caplog: Any) -> None:
    reporter = Reporter(None, PLACE, on_failure=lambda exc: None)
    with caplog.at_level(logging.WARNING, logger="shoal.report"):
        for step in range(3):
            reporter.add(step, None, {})
    assert reporter.dropped == 3
    assert len(caplog.records) == 1
    assert "SHOAL_DAEMON_URL" in caplog.records[0].getMessage()
    reporter.close()


def test_the_collective_clock_times_blocking_calls_only_and_restores_them() -> None:
    now = [0.0]

    def all_reduce(tensor: Any, async_op: bool = False) -> str:
        now[0] += 2.0
        return "work" if async_op else "done"

    dist = SimpleNamespace(all_reduce=all_reduce, barrier=lambda: None)
    dist.distributed_c10d = dist
    clock = CollectiveClock(clock=lambda: now[0])
    clock.install(dist)
    assert dist.all_reduce(1) == "done"
    assert dist.all_reduce(1, async_op=True) == "work"
    assert clock.take() == 2.0
    assert clock.take() == 0.0
    other = CollectiveClock()
    other.install(dist)  # a second clock leaves the wrapped ones alone
    clock.uninstall()
    assert dist.all_reduce is all_reduce
    other.uninstall()


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The variables torchrun gives a world of one (rank 0 hosts the store)."""
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "SHOAL_GENERATION": "4",
        "SHOAL_BACKEND": "gloo",
    }
    monkeypatch.delenv("SHOAL_DAEMON_URL", raising=False)
    yield env
    _, dist = torch_modules()
    assert not dist.is_initialized(), "the session destroyed its group"


def test_a_session_from_torchruns_env_measures_compute_around_collectives(
    torchrun_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch, dist = torch_modules()
    now = [0.0]
    real = dist.all_reduce

    def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        now[0] += 0.05  # waiting for a slower peer
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    sent: list[tuple[int, float | None]] = []
    rendezvous = rendezvous_from_env(torchrun_env)
    assert rendezvous is not None
    with TrainingSession(rendezvous, None, clock=lambda: now[0]) as session:
        assert (session.rank, session.world_size, session.generation) == (0, 1, 4)
        assert session.group.backend == "gloo"
        assert dist.get_world_size() == 1
        assert dist.all_reduce is not all_reduce, "wrapped while the session is open"
        monkeypatch.setattr(session._reporter, "add", lambda s, c, sc: sent.append((s, c)))
        session.report(0)
        for step in range(1, 4):
            now[0] += 0.02 * step  # the rank's own work
            dist.all_reduce(torch.ones(4))
            session.report(step)
        session.report(4, compute_s=1.5)
    assert dist.all_reduce is all_reduce, "the collectives are unwrapped at close"
    assert sent[0] == (0, None)
    assert [(step, round(c or 0, 6)) for step, c in sent[1:4]] == [(1, 0.02), (2, 0.04), (3, 0.06)]
    assert sent[4] == (4, 1.5)


def test_a_background_failure_is_raised_once_at_the_next_report(
    torchrun_env: dict[str, str],
) -> None:
    with training_session(env=torchrun_env, measure_compute=False) as session:
        session.report(1)
        session.group.report_error(SessionError("the daemon refused 1 progress reports"))
        with pytest.raises(SessionError, match="refused"):
            session.report(2)
        session.report(3)
        session.group.report_error(RuntimeError("disk full"))
        with pytest.raises(SessionError, match="disk full") as wrapped:
            session.report(4)
        assert isinstance(wrapped.value.__cause__, RuntimeError)


def test_a_ddp_model_reports_its_exposed_all_reduce(torchrun_env: dict[str, str]) -> None:
    torch, _ = torch_modules()
    with training_session(env=torchrun_env) as session:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
        session.watch_ddp(model)
        clock = session._clock
        assert clock is not None
        model(torch.ones(2, 8)).sum().backward()
        assert clock._ready_at > 0
        assert clock._done_at >= clock._ready_at
        assert clock.take() >= 0.0
        assert clock._ready_at == 0.0


def test_the_session_reads_the_daemons_rendezvous_as_node_serves_it() -> None:
    members = [
        NodeCapabilities("a", "10.0.0.1", nproc=2),
        NodeCapabilities("b", "10.0.0.2", nproc=2),
    ]
    plan = compute_plan(1, 1, members, RolePolicy(min_training=1, max_training=4, backend="gloo"))
    for node, local_rank in (("a", 0), ("b", 1)):
        served = rendezvous_for(plan, node, local_rank)
        assert served is not None
        parsed = parse_rendezvous(served.to_dict(), node)
        assert parsed is not None
        place = parsed.place
        assert (place.rank, place.local_rank, place.world_size) == (
            served.rank,
            served.local_rank,
            served.world_size,
        )
        assert (place.local_world_size, place.generation) == (
            served.local_world_size,
            served.generation,
        )
        assert (parsed.master_addr, parsed.master_port, parsed.backend) == (
            served.master_addr,
            served.master_port,
            served.backend,
        )
        assert parsed.store_prefix == served.store_prefix
    outside = rendezvous_for(plan, "c")
    assert outside is not None
    assert parse_rendezvous(outside.to_dict()) is None, "no rank for this node"


def test_the_sessions_timeouts_default_to_the_daemons() -> None:
    defaults = Timeouts()
    assert defaults.collective_s == session_module.DEFAULT_COLLECTIVE_S
    assert defaults.quorum_s == session_module.DEFAULT_QUORUM_S


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"RANK": "0", "WORLD_SIZE": "1"}, "MASTER_ADDR"),
        (
            {
                "RANK": "0",
                "WORLD_SIZE": "1",
                "MASTER_ADDR": "h",
                "MASTER_PORT": "1",
                "SHOAL_BACKEND": "mpi",
            },
            "SHOAL_BACKEND",
        ),
    ],
)
def test_bad_torchrun_variables_are_named(env: Mapping[str, str], problem: str) -> None:
    with pytest.raises(ShoalError, match=problem):
        rendezvous_from_env(env)
    assert rendezvous_from_env({}) is None


def test_no_daemon_and_no_torchrun_is_a_clear_error() -> None:
    port = free_port()
    env = {"SHOAL_DAEMON_URL": f"http://127.0.0.1:{port}", "LOCAL_RANK": "0"}
    with pytest.raises(ShoalError, match=f"no rank from http://127.0.0.1:{port} in 1 s"):
        training_session(env=env, join_timeout_s=1.0)


def test_a_session_object_is_the_documented_class() -> None:
    assert TrainingSession.__name__ == "TrainingSession"


def test_a_newer_generation_at_the_daemon_supersedes_the_session(
    torchrun_env: dict[str, str],
) -> None:
    rendezvous = rendezvous_from_env(torchrun_env)
    assert rendezvous is not None
    daemon = FakeDaemon({"accepted": 1, "generation": 4}, {"accepted": 0, "generation": 5})
    with TrainingSession(rendezvous, daemon, report_interval_s=3600) as session:  # type: ignore[arg-type]
        session.report(1)
        session._reporter.flush()
        assert not session.superseded(), "the same generation"
        session.report(2)
        session._reporter.flush()
        assert session.superseded(), "the daemon runs generation 5"
        session.report(3)  # a superseded session still never raises for it
