"""Providers: one contract run against `static` and `local`; static matching; acquire_node."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from config import Inventory, parse_inventory
from node.errors import DeployError, ProviderError
from node.providers import (
    RUNNING,
    STOPPED,
    GPUQuery,
    LocalProvider,
    NodeHandle,
    Provider,
    StaticProvider,
    acquire_node,
    ready_node,
)
from node.providers.ready import with_target


def inventory() -> Inventory:
    return parse_inventory(
        {
            "hosts": {
                "a100": {
                    "ssh_host": "10.0.0.1",
                    "gpu": "NVIDIA A100",
                    "gpu_count": 2,
                    "gpu_vram_gb": 80,
                },
                "h100": {"ssh_host": "10.0.0.2", "gpu": "H100", "gpu_count": 8, "gpu_vram_gb": 80},
                "cpu": {"ssh_host": "10.0.0.3"},
            }
        }
    )


@pytest.fixture(params=["static", "local"])
async def provider(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Provider]:
    if request.param == "static":
        yield StaticProvider(inventory())
        return
    async with LocalProvider(tmp_path / "local", capacity=1) as local:
        yield local


def query_for(provider: Provider) -> GPUQuery:
    return GPUQuery(type="H100", count=8) if provider.name == "static" else GPUQuery()


async def test_contract_acquire_list_stop_start_release(provider: Provider) -> None:
    assert isinstance(provider, Provider)
    handle = await provider.acquire(query_for(provider))
    assert handle.provider == provider.name
    assert handle.state == RUNNING
    assert handle.id in {h.id for h in await provider.list()}
    with pytest.raises(ProviderError, match="release one"):
        await provider.acquire(query_for(provider))  # the only match is held
    stopped = await provider.stop(handle)
    started = await provider.start(stopped.handle)
    assert started.handle.id == handle.id
    assert started.handle.state == RUNNING
    await provider.release(handle)
    again = await provider.acquire(query_for(provider))  # released: can be had again
    await provider.release(again)
    foreign = NodeHandle(provider="elsewhere", id="x", ssh=None)
    with pytest.raises(ProviderError):
        await provider.stop(foreign)


async def test_static_start_stop_are_reported_no_ops() -> None:
    static = StaticProvider(inventory())
    handle = await static.acquire(GPUQuery(type="a100", count=2, min_vram_gb=40))
    assert handle.id == "a100"
    assert handle.ssh == "a100"
    assert handle.url == "http://10.0.0.1:8770"
    result = await static.stop(handle)
    assert not result.changed
    assert "no-op" in result.message
    with pytest.raises(ProviderError, match="no free ready host"):
        await static.acquire(GPUQuery(type="A100", count=4))
    with pytest.raises(ProviderError, match="no free ready host"):
        await static.acquire(GPUQuery(type="H100", count=1, min_vram_gb=96))
    assert (await static.acquire(GPUQuery(count=0))).id == "cpu"


async def test_local_stop_ends_the_daemon_and_start_brings_it_back(tmp_path: Path) -> None:
    async with LocalProvider(tmp_path, capacity=1) as local:
        handle = await local.acquire(GPUQuery())
        assert handle.url is not None
        assert handle.ssh is None
        stopped = await local.stop(handle)
        assert stopped.changed
        assert stopped.handle.state == STOPPED
        assert (await local.list())[0].state == STOPPED
        assert not (await local.stop(handle)).changed
        started = await local.start(handle)
        assert started.changed
        assert started.handle.labels["pid"] != handle.labels["pid"]
        await local.release(handle)
        assert await local.list() == []
        assert not (tmp_path / handle.id).exists()


async def test_acquire_node_tri_modal() -> None:
    inv = inventory()
    assert await acquire_node(ssh="root@10.0.0.9:2222") == ("root@10.0.0.9:2222", None)
    assert await acquire_node(node_id="cpu", inventory=inv) == ("cpu", None)
    with pytest.raises(ProviderError, match="not a host"):
        await acquire_node(node_id="nope", inventory=inv)
    static = StaticProvider(inv)
    target, handle = await acquire_node(provision=GPUQuery(type="H100", count=1), provider=static)
    assert target == "h100"
    assert handle is not None
    assert handle.provider == "static"
    with pytest.raises(ValueError, match="exactly one"):
        await acquire_node(ssh="a", node_id="b")
    with pytest.raises(ProviderError, match="needs a provider"):
        await acquire_node(provision=GPUQuery())


async def test_ready_node_of_a_local_node_is_its_url(tmp_path: Path) -> None:
    async with LocalProvider(tmp_path, capacity=1) as local:
        ready = await ready_node(provision=GPUQuery(), provider=local, secret=b"s")
        assert ready.handle is not None
        assert ready.url == ready.handle.url
        assert ready.deployed is None


def test_with_target_adds_an_ssh_spec_to_the_inventory() -> None:
    inv = inventory()
    assert with_target(inv, "cpu") == (inv, "cpu")
    full, name = with_target(inv, "ubuntu@10.0.0.9:2222")
    assert name == "10.0.0.9"
    entry = full.hosts[name]
    assert (entry.ssh_user, entry.ssh_port, entry.address) == ("ubuntu", 2222, "10.0.0.9")
    assert set(full.hosts) == {*inv.hosts, name}


async def test_ready_node_releases_what_it_acquired_when_deploy_fails(tmp_path: Path) -> None:
    inv = parse_inventory(
        {"hosts": {"gone": {"ssh_host": "127.0.0.1", "ssh_port": 1, "gpu": "A100", "gpu_count": 1}}}
    )
    static = StaticProvider(inv)
    with pytest.raises(DeployError, match="deploy to gone failed"):
        await ready_node(
            provision=GPUQuery(),
            provider=static,
            inventory=inv,
            secret=b"s",
            known_hosts=tmp_path / "known_hosts",
            cache_dir=tmp_path / "cache",
        )
    assert (await static.acquire(GPUQuery())).id == "gone"  # released again
