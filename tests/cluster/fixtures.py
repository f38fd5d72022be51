"""pytest plugin of the multi-host harness: cluster fixtures, netns skips, logs on failure.

Registered for the whole suite by `tests/conftest.py` (`pytest_plugins`).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Protocol

import pytest

from tests.cluster.cluster import Cluster, LoopbackCluster
from tests.cluster.netns import DEFAULT_PORT, NetnsCluster, netns_unavailable_reason

__all__ = [
    "LoopbackClusterFactory",
    "NetnsClusterFactory",
    "loopback_cluster",
    "netns_cluster",
    "require_netns",
]

REQUIRE_NETNS_ENV = "SHOAL_REQUIRE_NETNS"
"""Set to 1 (in CI) to fail instead of skip when netns tests cannot run."""

LOG_TAIL_LINES = 40

_clusters_key = pytest.StashKey[list[Cluster]]()


class NetnsClusterFactory(Protocol):
    def __call__(self, n: int = 3, *, port: int = DEFAULT_PORT) -> NetnsCluster: ...


class LoopbackClusterFactory(Protocol):
    def __call__(self, n: int = 3, *, host: str = "127.0.0.1") -> LoopbackCluster: ...


def require_netns() -> None:
    """Skip the running test unless netns clusters can run here (fail instead under CI's flag)."""
    reason = netns_unavailable_reason()
    if reason is None:
        return
    message = f"netns tests need root and iproute2: {reason}"
    if os.environ.get(REQUIRE_NETNS_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_NETNS_ENV}=1)")
    pytest.skip(message)


def _close(clusters: list[Cluster]) -> None:
    errors = []
    for cluster in reversed(clusters):
        try:
            cluster.close()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def _track(node: pytest.Item | pytest.Collector, cluster: Cluster) -> None:
    node.stash.setdefault(_clusters_key, []).append(cluster)


@pytest.fixture
def netns_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NetnsClusterFactory]:
    """Factory: `netns_cluster(n)` makes a `NetnsCluster` of n hosts, closed after the test.

    Skips the test without root, `ip` or `nft`. Logs go under `tmp_path/netns<k>/logs`.
    """
    require_netns()
    made: list[Cluster] = []

    def make(n: int = 3, *, port: int = DEFAULT_PORT) -> NetnsCluster:
        cluster = NetnsCluster(n, tmp_path / f"netns{len(made)}", port=port)
        made.append(cluster)
        _track(request.node, cluster)
        return cluster

    yield make
    _close(made)


@pytest.fixture
def loopback_cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[LoopbackClusterFactory]:
    """Factory: `loopback_cluster(n)` makes a `LoopbackCluster` of n hosts, closed after it
    (`host="::1"`: on IPv6 loopback)."""
    made: list[Cluster] = []

    def make(n: int = 3, *, host: str = "127.0.0.1") -> LoopbackCluster:
        cluster = LoopbackCluster(n, tmp_path / f"loopback{len(made)}", host=host)
        made.append(cluster)
        _track(request.node, cluster)
        return cluster

    yield make
    _close(made)


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated so the plugin works on its own (--strict-markers).
    config.addinivalue_line("markers", "netns: needs root and ip netns (multi-host harness)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test using netns_cluster is a netns test, so `-m "not netns"` deselects it.
    for item in items:
        if "netns_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.netns)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("netns") is not None:
        require_netns()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # On failure, show what every daemon of the test's clusters said, under the failure.
    report = yield
    if report.failed and report.when in {"setup", "call"}:
        clusters = item.stash.get(_clusters_key, None) or []
        for index, cluster in enumerate(clusters):
            if cluster.processes:
                title = f"{cluster.mode} cluster {index} process logs (last {LOG_TAIL_LINES} lines)"
                report.sections.append((title, cluster.log_tails(LOG_TAIL_LINES)))
    return report
