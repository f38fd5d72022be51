"""An in-place session (SHOAL_REFORM=in_place) in one process, against a stand-in daemon: its
collectives give way once the daemon runs a newer generation, `reform` joins that generation
keeping the state it holds, a replacement waits for a generation above the one it failed in,
and the settings are checked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shoal import joining
from shoal import session as session_module
from shoal.errors import SessionError, ShoalError
from shoal.group import torch_modules
from shoal.guard import GroupChanged
from shoal.session import TrainingSession, training_session
from tests.cluster.cluster import free_port


class StandInDaemon:
    """A DaemonClient stand-in that serves one rendezvous (a world of one) per generation and
    takes reports; `generation` moves it on."""

    url = "http://stand-in"

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.ports: dict[int, int] = {}
        self.asked: list[str] = []
        self.broken: list[str] = []
        self.lock = threading.Lock()

    def answer(self) -> dict[str, Any]:
        with self.lock:
            generation = self.generation
            port = self.ports.setdefault(generation, free_port())
        return {
            "rank": 0,
            "local_rank": 0,
            "world_size": 1,
            "local_world_size": 1,
            "generation": generation,
            "master_addr": "127.0.0.1",
            "master_port": port,
            "backend": "gloo",
        }

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.asked.append(f"{method} {path}")
        if method == "GET" and path.startswith("/v1/rendezvous"):
            return self.answer()
        if (body or {}).get("broken"):  # as a coordinator does: the next generation
            self.broken.append(body["broken"])
            self.generation = body["generation"] + 1
        return {"accepted": len((body or {}).get("reports", [])), "generation": self.generation}

    def close(self) -> None:
        pass


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInDaemon]:
    stand_in = StandInDaemon(generation=3)
    monkeypatch.setattr(session_module.DaemonClient, "from_env", lambda env: stand_in)
    yield stand_in
    _, dist = torch_modules()
    if dist.is_initialized():
        dist.destroy_process_group()


def env_of(daemon: StandInDaemon, **more: str) -> dict[str, str]:
    answer = daemon.answer()
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(answer["master_port"]),
        "SHOAL_GENERATION": str(answer["generation"]),
        "SHOAL_BACKEND": "gloo",
        "SHOAL_DAEMON_URL": daemon.url,
        "SHOAL_REFORM": "in_place",
        **more,
    }


def all_reduce_for(seconds: float) -> None:
    """All-reduce again and again for `seconds` (until a collective raises)."""
    torch, dist = torch_modules()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)


def test_a_newer_generation_makes_the_collective_give_way_and_reform_keeps_the_state(
    daemon: StandInDaemon,
) -> None:
    torch, dist = torch_modules()
    state: dict[str, Any] = {"weights": torch.full((3,), 5.0)}
    with training_session(env=env_of(daemon)) as session:
        assert isinstance(session, TrainingSession)
        assert session.in_place
        assert session.restore(state) is None  # nothing live, nothing committed
        assert session.last_reform is not None
        assert session.last_reform.source == "checkpoint"
        dist.all_reduce(torch.ones(1))  # the group works
        daemon.generation = 4
        with pytest.raises(GroupChanged, match="generation 3 is superseded"):
            all_reduce_for(10.0)
        assert session.reform(state, 41) == 41
        assert session.generation == 4
        reform = session.last_reform
        assert reform is not None
        assert (reform.generation, reform.step, reform.source) == (4, 41, "memory")
        assert torch.equal(state["weights"], torch.full((3,), 5.0))
        value = torch.ones(1)
        dist.all_reduce(value)  # the new group works, and does not give way
        assert value.item() == 1.0
        assert not session.superseded()


def test_a_group_that_broke_here_first_asks_the_daemon_for_the_next_generation(
    daemon: StandInDaemon,
) -> None:
    torch, _ = torch_modules()
    state: dict[str, Any] = {"weights": torch.zeros(2)}
    with training_session(env=env_of(daemon)) as session:
        session.restore(state)
        assert session._guard is not None  # the test fails a collective as a dead peer would
        session._guard._changed("all_reduce failed: Connection reset by peer")
        assert session.reform(state, 12) == 12
        assert daemon.broken == ["all_reduce failed: Connection reset by peer"]
        assert session.generation == 4


def test_a_replacement_waits_for_a_generation_above_the_one_it_failed_in(
    daemon: StandInDaemon,
) -> None:
    stale = env_of(daemon, SHOAL_AFTER_GENERATION="3")  # RANK and the rest are generation 3's
    threading.Timer(0.6, lambda: setattr(daemon, "generation", 4)).start()
    started = time.monotonic()
    with training_session(env=stale, join_timeout_s=10) as session:
        assert session.generation == 4
        assert time.monotonic() - started >= 0.5
        assert "GET /v1/rendezvous" in daemon.asked


def test_reform_needs_in_place_and_the_setting_is_checked(daemon: StandInDaemon) -> None:
    with training_session(env=env_of(daemon, SHOAL_REFORM="restart")) as session:
        assert not session.in_place
        with pytest.raises(SessionError, match="reform needs SHOAL_REFORM=in_place"):
            session.reform({}, 1)
    with pytest.raises(ShoalError, match="SHOAL_REFORM='sometimes' must be in_place or restart"):
        training_session(env=env_of(daemon, SHOAL_REFORM="sometimes"))
    with pytest.raises(ShoalError, match="SHOAL_AFTER_GENERATION='x' is not an integer"):
        training_session(env=env_of(daemon, SHOAL_AFTER_GENERATION="x"))


def test_the_launcher_and_the_session_name_the_same_variables() -> None:
    from node.training import torchrun

    assert torchrun.ENV_REFORM == joining.ENV_REFORM
    assert torchrun.ENV_AFTER_GENERATION == joining.ENV_AFTER_GENERATION


class CountingStore:
    """A store's `add` for the join barrier: `others` ranks joined before us."""

    def __init__(self, others: int) -> None:
        self.count = others

    def add(self, key: str, amount: int) -> int:
        assert key == "shoal/joined"
        self.count += amount
        return self.count


def test_the_join_barrier_waits_for_every_rank_and_gives_way_to_a_newer_generation() -> None:
    from shoal.group import join_barrier

    store = CountingStore(others=2)
    join_barrier(store, 3, 5, time.monotonic() + 5, lambda: None)  # we are the third
    assert store.count == 3
    reasons = iter([None, None, "generation 6 is ready"])
    started = time.monotonic()
    with pytest.raises(ShoalError, match=r"generation 5: generation 6 is ready \(1/3 ranks"):
        join_barrier(CountingStore(others=0), 3, 5, started + 30, lambda: next(reasons))
    assert time.monotonic() - started < 5
    with pytest.raises(ShoalError, match="generation 5: 2 of 3 ranks joined before the deadline"):
        join_barrier(CountingStore(others=1), 3, 5, time.monotonic() + 0.2, lambda: None)
