"""Auto-stop inside the daemon: the node's own provider (`provider:` setting), the idle checks
read from the job service, the cluster's run locks and NVML, start-up recovery of an
interrupted decision, and what /v1/status and /metrics show."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from prometheus_client import Gauge

from config import HostEntry, Inventory
from net import PeerRequestError
from node.component import Check, Endpoint
from node.errors import ProviderError
from node.locks.service import LockService
from node.locks.wire import LOCKS_PATH
from node.providers.autostop import (
    AutoStop,
    AutostopPolicy,
    AutostopSectionLike,
    IdleChecks,
    disabled_status,
    recover_interrupted,
    starting_status,
)
from node.providers.base import RUNNING, STOPPED, ActionResult, GPUQuery, NodeHandle, Provider
from node.providers.decision import AutostopDecision
from node.providers.static import StaticProvider
from node.runtime import AutostopStatusJson, NodeRuntime

log = logging.getLogger(__name__)


class OwnLocalNode:
    """A node of the `local` provider as its own daemon sees it: stopping (or releasing) it
    ends this daemon, gracefully, through `request_stop`; its provider then lists it stopped
    (the provider that acquired it removes its directory on release)."""

    name = "local"

    def __init__(self, node_id: str, request_stop: Callable[[str], None]) -> None:
        self.handle = NodeHandle(self.name, node_id, ssh=None)
        self._request_stop = request_stop

    def _check(self, handle: NodeHandle) -> None:
        if handle.provider != self.name or handle.id != self.handle.id:
            raise ProviderError(
                f"local node {self.handle.id}: {handle.provider}/{handle.id} is not this node"
            )

    async def acquire(self, query: GPUQuery) -> NodeHandle:
        raise ProviderError(
            f"local node {self.handle.id}: a node acquires nothing through itself; "
            "use LocalProvider on the host"
        )

    async def release(self, handle: NodeHandle) -> None:
        self._check(handle)
        self._request_stop(f"local node {handle.id} released by auto-stop")

    async def start(self, handle: NodeHandle) -> ActionResult:
        self._check(handle)
        return ActionResult(handle, False, f"local node {handle.id} already runs")

    async def stop(self, handle: NodeHandle) -> ActionResult:
        self._check(handle)
        self._request_stop(f"local node {handle.id} stopped by auto-stop")
        return ActionResult(
            handle.with_state(STOPPED), True, f"local node {handle.id}: the daemon shuts down"
        )

    async def list(self) -> list[NodeHandle]:
        return [self.handle.with_state(RUNNING)]


def own_provider(
    kind: str,
    node_id: str,
    address: str,
    inventory: Inventory | None,
    request_stop: Callable[[str], None],
) -> tuple[Provider, NodeHandle]:
    """This node's provider and its handle there. `static`: its inventory host (or, outside
    an inventory, itself as a one-host inventory at `address`); `local`: OwnLocalNode."""
    if kind == "local":
        local = OwnLocalNode(node_id, request_stop)
        return local, local.handle
    if kind != "static":
        raise ProviderError(f"provider {kind!r}: this daemon knows only static and local")
    if inventory is None or node_id not in inventory.hosts:
        inventory = Inventory(hosts={node_id: HostEntry(ssh_host=address)})
    return StaticProvider(inventory), NodeHandle("static", node_id, ssh=node_id)


def locks_held_here(table: Mapping[str, Any], node_id: str, hostname: str) -> list[str]:
    """Names of the locks of a /v1/locks table held for this node: by a queued run whose job
    runs here (`job_node`), or by a holder named after this node or host (`NODE`, `NODE:...`,
    or the lock client's default `HOST:pid:...`)."""
    runs = table.get("runs")
    runs = runs if isinstance(runs, Mapping) else {}
    locks = table.get("locks")
    held = []
    for name, state in (locks if isinstance(locks, Mapping) else {}).items():
        holder = state.get("holder") if isinstance(state, Mapping) else None
        if not isinstance(holder, str):
            continue
        run = runs.get(holder)
        runs_here = isinstance(run, Mapping) and run.get("job_node") == node_id
        named_here = holder == node_id or holder.startswith((f"{node_id}:", f"{hostname}:"))
        if runs_here or named_here:
            held.append(str(name))
    return sorted(held)


async def read_lock_table(locks: LockService) -> Mapping[str, Any]:
    """The cluster's lock table: this node's own while it coordinates, else the coordinator's
    GET /v1/locks. Raises ProviderError when there is no coordinator or it does not answer."""
    if locks.is_coordinator():
        await locks.apply(lambda table, term, now: (table, None))
        return locks.table.to_dict()
    coordinator = locks.runtime.coordinator
    url = locks.url_of(coordinator) if coordinator is not None else None
    if url is None:
        raise ProviderError("no coordinator known to ask which run locks this node holds")
    try:
        status, body = await locks.peers.call_json("GET", url, LOCKS_PATH)
    except PeerRequestError as exc:
        raise ProviderError(f"coordinator {coordinator}: {exc.reason}") from exc
    if status != 200:
        raise ProviderError(f"coordinator {coordinator} answered {status} for locks")
    if not isinstance(body, Mapping):
        raise ProviderError(f"coordinator {coordinator} sent a lock table that is not an object")
    return body


def gpu_utilization_of(runtime: NodeRuntime) -> Callable[[], Awaitable[Sequence[float | None]]]:
    """Each GPU's utilisation (None when unreadable) from the daemon's NVML reader, read in a
    thread; a failed read raises (and so counts as busy)."""

    async def read() -> Sequence[float | None]:
        gpus = await asyncio.to_thread(runtime.gpus)
        found: list[float | None] = []
        for gpu in gpus:
            util = gpu.get("util_pct")
            found.append(float(util) if isinstance(util, int | float) else None)
        return found

    return read


def autostop_section(
    runtime: NodeRuntime, inventory: Inventory | None
) -> AutostopSectionLike | None:
    """The node's `autostop:` settings, else its inventory host's, else None."""
    if runtime.settings.autostop is not None:
        return runtime.settings.autostop
    entry = inventory.hosts.get(runtime.node_id) if inventory is not None else None
    return entry.autostop if entry is not None else None


class AutostopPart:
    """Auto-stop as a component of the daemon: `open()` recovers an interrupted decision, then
    starts auto-stop when configured (`autostop:` in the settings or the node's inventory
    host); `status()` is the status document's `autostop` object either way: enabled and
    `starting` for a configured node whose auto-stop has not started yet (the API answers
    before it does), `off` for a node without a section."""

    def __init__(
        self,
        runtime: NodeRuntime,
        inventory: Inventory | None,
        running_jobs: Callable[[], int],
        locks: LockService,
        request_stop: Callable[[str], None],
    ) -> None:
        self._runtime = runtime
        self._inventory = inventory
        self._running_jobs = running_jobs
        self._locks = locks
        self._request_stop = request_stop
        self.auto: AutoStop | None = None
        self._recovered: AutostopDecision | None = None
        self._gauge: Gauge | None = None
        self._section = autostop_section(runtime, inventory)

    def status(self) -> AutostopStatusJson:
        if self.auto is not None:
            return self.auto.status()
        if self._section is not None:
            return starting_status(self._recovered)
        return disabled_status(self._recovered)

    def routes(self) -> Sequence[Endpoint]:
        return ()

    def checks(self) -> Mapping[str, Check]:
        if self.auto is None:
            return {}
        interval = min(self.auto.policy.check_interval_s, 5.0)
        return {"autostop": Check(self.auto.loop_health.check, interval_s=interval)}

    async def open(self) -> None:
        runtime = self._runtime
        wal = runtime.wal
        assert wal is not None, "the WAL opens before auto-stop"
        recovered = await recover_interrupted(wal)
        for decision in recovered:
            runtime.notes.append(f"autostop: {decision.outcome} (WAL entry {decision.entry})")
        self._recovered = recovered[-1] if recovered else None
        if self._section is None:
            return
        auto = self._build(self._section)
        await auto.load()
        self.auto = auto
        if runtime.metrics is not None:
            self._gauge = Gauge(
                "shoal_autostop_idle_seconds",
                "Seconds this node has been idle by auto-stop's checks (0 while busy).",
                registry=runtime.metrics.registry,
            )
            self._gauge.set_function(auto.idle_for_s)
        auto.start()
        log.info(
            "autostop: %s %s/%s after %g s idle%s",
            auto.policy.action,
            auto.handle.provider,
            auto.handle.id,
            auto.policy.idle_s,
            " (dry run)" if auto.dry_run else "",
        )

    def _build(self, section: AutostopSectionLike) -> AutoStop:
        runtime, locks = self._runtime, self._locks
        settings = runtime.settings.autostop
        policy = AutostopPolicy.of_section(
            section, settings.check_interval_s if settings is not None else None
        )
        provider, handle = own_provider(
            runtime.settings.provider,
            runtime.node_id,
            runtime.address,
            self._inventory,
            self._request_stop,
        )
        hostname = socket.gethostname()
        running_jobs = self._running_jobs

        async def jobs() -> int:
            return running_jobs()

        async def held() -> list[str]:
            return locks_held_here(await read_lock_table(locks), runtime.node_id, hostname)

        return AutoStop(
            provider,
            handle,
            policy,
            IdleChecks(jobs, held, gpu_utilization_of(runtime)),
            wal=runtime.wal,
            dry_run=settings.dry_run if settings is not None else False,
        )

    async def close(self) -> None:
        if self.auto is not None:
            await self.auto.close()
        if self._gauge is not None and self._runtime.metrics is not None:
            with contextlib.suppress(KeyError):
                self._runtime.metrics.registry.unregister(self._gauge)
            self._gauge = None
