"""`shoal keyring` against real daemons on 127.0.0.1 with a cluster secret: a live rotation on
five members while SWIM runs (no member suspected), the exit codes, the audit, and a node that
was down during the rotation rejoining once given the key."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from typer.testing import CliRunner, Result

from node import NodeDaemon
from node.cli import app
from node.errors import KeyringError
from node.membership.keyring import KEYRING_FILE, derived_key, key_id, read_key_file
from node.membership.types import EventKind, MemberEvent
from tests.node.daemons import test_settings
from tests.node.jobs.client_daemon import free_port

SECRET = b"keyring-test-secret-0123456789abcdef"
SLOW_ENOUGH = {
    # suspicion long enough that a loaded CI host does not suspect anyone without a cause
    "timeouts.probe_interval_s": 0.2,
    "timeouts.probe_timeout_s": 0.1,
    "timeouts.indirect_probe_timeout_s": 0.2,
    "timeouts.suspicion_s": 3.0,
    "timeouts.heartbeat_interval_s": 0.2,
    "timeouts.lease_s": 2.0,
    "timeouts.election_min_s": 1.0,
    "timeouts.election_max_s": 2.0,
}
NAMES = [f"k{i}" for i in range(6)]
ROTATING = NAMES[:5]
LATE = NAMES[5]


async def _until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Swarm:
    """Six daemons at fixed ports, each seeded with every other (as an inventory does)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.ports = {name: free_port() for name in NAMES}
        self.cluster = f"kr{os.getpid()}"
        self.secret_file = tmp_path / "secret"
        self.secret_file.write_bytes(SECRET)
        self.secret_file.chmod(0o600)
        self.config = tmp_path / "cli.yaml"
        self.config.write_text(
            json.dumps({"secret_file": str(self.secret_file), "cluster_name": self.cluster})
        )
        self.daemons: dict[str, NodeDaemon] = {}
        self.failures: list[tuple[str, str, str]] = []

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    async def start(self, name: str) -> NodeDaemon:
        seeds = tuple(f"127.0.0.1:{port}" for other, port in self.ports.items() if other != name)
        settings = test_settings(
            self.tmp_path,
            name,
            port=self.ports[name],
            seeds=seeds,
            voters=tuple(ROTATING),
            secret_file=self.secret_file,
            cluster_name=self.cluster,
            **SLOW_ENOUGH,
        )
        daemon = NodeDaemon(settings)
        await daemon.start()
        self.daemons[name] = daemon
        membership = daemon.runtime.membership  # type: ignore[union-attr]

        def watch(event: MemberEvent) -> None:
            if event.kind in (EventKind.SUSPECT, EventKind.DEAD):
                self.failures.append((name, event.member.node_id, str(event.kind)))

        membership.add_listener(watch)  # type: ignore[union-attr]
        return daemon

    async def stop(self, name: str) -> None:
        await self.daemons.pop(name).close()

    async def close(self) -> None:
        for name in list(self.daemons):
            await self.stop(name)

    def alive(self, names: list[str]) -> bool:
        return all(
            self.daemons[n].runtime.membership.counts()["alive"] == len(names)  # type: ignore[union-attr]
            for n in names
        )

    async def shoal(self, *args: str) -> Result:
        config = [] if args[0] == "generate" else ["--config", str(self.config)]
        argv = ["keyring", *args, *config]
        return await asyncio.to_thread(CliRunner().invoke, app, argv)


async def test_rotation_on_five_members_and_a_late_node_rejoins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, "node.membership.channel")
    swarm = Swarm(tmp_path)
    first = key_id(derived_key(SECRET, swarm.cluster))
    try:
        for name in NAMES:
            await swarm.start(name)
        await _until(lambda: _true(swarm.alive(NAMES)), 30, "six alive")

        async def coordinated() -> bool:
            seen = set()
            for daemon in swarm.daemons.values():
                assert daemon.runtime is not None
                daemon.runtime.refresh()
                seen.add(daemon.runtime.coordinator)
            return len(seen) == 1 and None not in seen

        await _until(coordinated, 30, "a coordinator")
        listed = await swarm.shoal("list", "--json", "--node", swarm.url("k1"))
        assert listed.exit_code == 0, listed.output
        answer = json.loads(listed.output)
        assert answer["keys"] == [{"id": first, "members": 6, "in_use_by": sorted(NAMES)}]
        assert SECRET.hex() not in listed.output

        await swarm.stop(LATE)  # down during the rotation
        await _until(lambda: _true(swarm.alive(ROTATING)), 30, "the late node gone")
        swarm.failures.clear()

        keyfile = tmp_path / "k2.key"
        made = await swarm.shoal("generate", "--out", str(keyfile))
        assert made.exit_code == 0, made.output
        second = made.output.split()[1]
        assert stat_mode(keyfile) == 0o600

        refused = await swarm.shoal("remove", first, "--node", swarm.url("k2"))
        assert refused.exit_code == 2, refused.output
        assert "in use" in refused.output
        early = await swarm.shoal("use", second, "--node", swarm.url("k2"))
        assert early.exit_code == 2, "no member holds it yet: bad input"
        for step in (["install", str(keyfile)], ["use", second], ["remove", first]):
            done = await swarm.shoal(*step, "--json", "--node", swarm.url("k3"))
            assert done.exit_code == 0, done.output
            assert json.loads(done.output)["acked"] == sorted(ROTATING)
            await _until(lambda: _true(swarm.alive(ROTATING)), 10, "five alive")
        assert swarm.failures == [], f"suspected during the rotation: {swarm.failures}"
        for name in ROTATING:
            ring = swarm.daemons[name].gossip_keys
            assert ring is not None
            assert (ring.ring.ids, ring.ring.primary) == ([second], second)
        listed = await swarm.shoal("list", "--json", "--node", swarm.url("k0"))
        assert json.loads(listed.output)["keys"] == [
            {"id": second, "members": 5, "in_use_by": sorted(ROTATING)}
        ]

        where = ["--node", swarm.url("k4"), "--config", str(swarm.config)]
        audit_argv = ["audit", "--kind", "keyring", "--json", *where]
        audit = await asyncio.to_thread(CliRunner().invoke, app, audit_argv)
        assert audit.exit_code == 0, audit.output
        entries = [e for e in json.loads(audit.output)["entries"] if e["kind"] == "keyring"]
        assert [(e["action"], e["subject"]) for e in entries] == [
            ("install", second),
            ("use", second),
            ("remove", first),
        ]
        assert all(e["detail"]["requested_by"].startswith("cli-") for e in entries), entries

        late = await swarm.start(LATE)  # it still holds only the first key

        def lacked() -> bool:
            text = f"sealed with gossip key {second}, which this node lacks"
            return any(text in record.getMessage() for record in caplog.records)

        await _until(lambda: _true(lacked()), 30, "the late node to name the key it lacks")
        assert late.runtime is not None
        assert late.runtime.metrics is not None
        scraped = generate_latest(late.runtime.metrics.registry).decode()
        assert 'shoal_membership_datagrams_dropped_total{reason="unknown_key"}' in scraped
        assert not swarm.alive(NAMES)
        assert late.gossip_keys is not None
        assert late.gossip_keys.ring.ids == [first]
        given = await swarm.shoal("install", str(keyfile), "--local", "--node", swarm.url(LATE))
        assert given.exit_code == 0, given.output
        used = await swarm.shoal("use", second, "--local", "--node", swarm.url(LATE))
        assert used.exit_code == 0, used.output
        await _until(lambda: _true(swarm.alive(NAMES)), 30, "the late node to rejoin")

        # a member that lacks a key stops `use` before anything changes: exit 1 naming it
        third = tmp_path / "k3.key"
        await swarm.shoal("generate", "--out", str(third))
        only_k0 = await swarm.shoal("install", str(third), "--local", "--node", swarm.url("k0"))
        assert only_k0.exit_code == 0, only_k0.output
        kid = key_id_of(third)
        stranded = await swarm.shoal("use", kid, "--node", swarm.url("k1"))
        assert stranded.exit_code == 1, stranded.output
        assert "k5" in stranded.output
        assert "lack key" in stranded.output
        assert all(
            d.gossip_keys is not None and d.gossip_keys.ring.primary == second
            for d in swarm.daemons.values()
        )

        # a member that cannot write its keyring does not acknowledge: exit 1 naming it
        def disk_full(key: bytes) -> str:
            raise KeyringError("keyring_file", "keyring.json: No space left on device")

        broken = swarm.daemons["k2"].gossip_keys
        assert broken is not None
        monkeypatch.setattr(broken, "install", disk_full)
        partial = await swarm.shoal("install", str(third), "--node", swarm.url("k4"))
        assert partial.exit_code == 1, partial.output
        assert "k2 did not acknowledge" in partial.output
        assert "No space left" in partial.output
    finally:
        await swarm.close()
    keyring = tmp_path / "k0" / KEYRING_FILE
    assert stat_mode(keyring) == 0o600


async def test_bad_input_exits_2_before_asking_anyone(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)  # no daemon runs: each refusal comes before any request
    keyfile = tmp_path / "k.key"
    made = await swarm.shoal("generate", "--out", str(keyfile))
    assert made.exit_code == 0, made.output
    again = await swarm.shoal("generate", "--out", str(keyfile))
    assert again.exit_code == 2
    assert "exists" in again.output
    keyfile.chmod(0o644)
    loose = await swarm.shoal("install", str(keyfile), "--node", swarm.url("k0"))
    assert loose.exit_code == 2
    assert "readable by group or others" in loose.output
    keyfile.chmod(0o600)
    keyfile.write_text("bm90IGEga2V5\n")
    short = await swarm.shoal("install", str(keyfile), "--node", swarm.url("k0"))
    assert short.exit_code == 2
    assert "32 bytes" in short.output
    for op in ("use", "remove"):
        malformed = await swarm.shoal(op, "not-a-key-id", "--node", swarm.url("k0"))
        assert malformed.exit_code == 2
        assert "not a key id" in malformed.output
    unreachable = await swarm.shoal("list", "--node", swarm.url("k0"))
    assert unreachable.exit_code == 1


async def test_a_keyring_readable_by_others_stops_the_daemon(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    await swarm.start("k0")
    await swarm.stop("k0")
    keyring = tmp_path / "k0" / KEYRING_FILE
    keyring.chmod(0o644)
    with pytest.raises(Exception, match=r"keyring\.json: gossip keyring is readable by group"):
        await swarm.start("k0")


async def _true(value: bool) -> bool:
    return value


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def key_id_of(path: Path) -> str:
    return key_id(read_key_file(path))
