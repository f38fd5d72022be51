"""`shoal deploy` and `shoal undeploy`: put an authenticated daemon on inventory hosts over SSH.

Per host: probe (read only), plan (a pure function of the probe and the wanted state), then
unless dry-run: push wheels over SFTP, create or reuse a venv, install, write the node config,
inventory and secret (mode 600) and with `--ca` the host's TLS files, start under systemd or
detached with a pid file, wait for /v1/health, and record what was deployed in
`<path>/deploy.json` so a second run is `unchanged` (and, through a recorder, in the host
daemon's audit trail).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import asyncssh

from config import HostEntry, Inventory
from net import PeerClient, PeerRequestError, peer_url, split_url
from node.errors import DeployError, SSHError
from node.ssh.certs import NodeTls, node_tls
from node.ssh.executor import SSHExecutor
from node.ssh.plan import (
    DEFAULT_CACHE_DIR,
    FAILED,
    HEALTH_TIMEOUT_S,
    REMOVED,
    STEP_TIMEOUT_S,
    UNIT_NAME,
    Desired,
    HostFacts,
    Remote,
    Step,
    Upload,
    WriteFile,
    node_config_text,
    parse_facts,
    plan_deploy,
    probe_script,
    remote_root,
    stop_pid_step,
    systemctl_argv,
    unit_path,
)
from node.ssh.wheels import build_shoal_wheel, dependency_wheels


@dataclass(frozen=True)
class DeployResult:
    """What deploy (or undeploy) did on one host, or would do (`dry_run`)."""

    host: str
    status: str
    duration_s: float
    reason: str | None = None
    steps: tuple[str, ...] = ()
    dry_run: bool = False
    pid: int | None = None
    version: str | None = None
    fingerprint: str | None = None
    certificate: dict[str, object] | None = None
    audit_problem: str | None = None

    def line(self) -> str:
        """One line for the operator: `host: installed (12.3s)` or `host: failed: reason`."""
        status = f"{FAILED}: {self.reason}" if self.status == FAILED else self.status
        note = " (dry run: nothing changed)" if self.dry_run else ""
        return f"{self.host}: {status} ({self.duration_s:.1f}s){note}"

    def as_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "steps": list(self.steps),
            "dry_run": self.dry_run,
            "pid": self.pid,
            "version": self.version,
            "certificate": self.certificate,
            "audit_problem": self.audit_problem,
        }


class DeployRecorder(Protocol):
    """Records a finished deploy in the audit trail of the host's daemon."""

    async def record(self, host: str, result: DeployResult, *, rolling: bool) -> str | None:
        """The problem, or None (recorded, or nothing to record)."""
        ...


def certificate_summary(tls: NodeTls | None) -> dict[str, object] | None:
    """What a result says of the host's certificate: serial, expiry, issued now or kept, why."""
    if tls is None:
        return None
    return {
        "serial": tls.serial,
        "not_after": tls.not_after,
        "issued": tls.issued,
        "pending": tls.pending,
        "reason": tls.reason,
    }


async def _execute(
    executor: SSHExecutor, host: str, steps: Sequence[Step], timeout_s: float
) -> None:
    async with executor.lease(host) as conn:
        for step in steps:
            if isinstance(step, Remote):
                result = await executor.run(host, list(step.argv), timeout_s)
                if not result.ok:
                    tail = result.stderr.strip()[-400:]
                    detail = result.error or f"exited {result.exit_code}: {tail}"
                    raise DeployError(f"{step.what}: {detail}")
                continue
            await _transfer(conn, step, timeout_s)


async def _transfer(
    conn: asyncssh.SSHClientConnection, step: Upload | WriteFile, timeout_s: float
) -> None:
    temp = f"{step.remote}.part"
    try:
        async with asyncio.timeout(timeout_s), conn.start_sftp_client() as sftp:
            if isinstance(step, Upload):
                await sftp.put(str(step.local), temp)
            else:
                attrs = asyncssh.SFTPAttrs(permissions=step.mode)
                async with sftp.open(temp, "w", attrs=attrs) as remote_file:
                    await remote_file.write(step.text)
                await sftp.chmod(temp, step.mode)
            await sftp.posix_rename(temp, step.remote)
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        what = step.remote if isinstance(step, WriteFile) else step.describe()
        raise DeployError(f"sftp {what}: {reason}") from exc


async def wait_healthy(url: str, timeout_s: float) -> None:
    """Return once GET `url` answers 200; DeployError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    base, path = split_url(url)
    async with PeerClient() as peers:
        while time.monotonic() < deadline:
            try:
                answer = await peers.request("GET", base, path, timeout_s=5.0, check=False)
                if answer.status == 200:
                    return
                last = f"HTTP {answer.status}"
            except PeerRequestError as exc:
                last = exc.reason
            await asyncio.sleep(0.2)
    raise DeployError(f"{url} not healthy within {timeout_s:g}s ({last}); see daemon.log")


def health_url(entry: HostEntry) -> str:
    """The /v1/health URL of a host's daemon, through its inventory address."""
    return peer_url(entry.address, entry.p2p_port) + "/v1/health"


async def host_facts(executor: SSHExecutor, host: str, entry: HostEntry) -> HostFacts:
    probe = await executor.run(host, ["sh", "-c", probe_script(entry.path)], 60.0)
    if not probe.ok:
        raise DeployError(probe.error or f"probe exited {probe.exit_code}: {probe.stderr.strip()}")
    return parse_facts(probe.stdout)


async def deploy_host(
    executor: SSHExecutor,
    host: str,
    desired_for: dict[str, Desired],
    *,
    dry_run: bool = False,
    health_timeout_s: float = HEALTH_TIMEOUT_S,
    ca_dir: Path | None = None,
) -> DeployResult:
    """Deploy to one host; every failure is this host's `failed` result. With `ca_dir`, the
    host's node certificate is kept or issued (not in a dry run) and pushed with the CA
    certificate and CRL."""
    started = time.monotonic()
    entry = executor.inventory.hosts[host]
    steps: list[Step] = []
    tls: NodeTls | None = None
    try:
        facts = await host_facts(executor, host, entry)
        root = remote_root(entry, facts.home)
        desired = desired_for[host]
        if ca_dir is not None:
            tls = await asyncio.to_thread(
                node_tls, ca_dir, host, entry, facts.tls_cert, facts.tls_key, issue=not dry_run
            )
            desired = dataclasses.replace(desired, tls=tls)
        status, steps = plan_deploy(host, entry, facts, desired)
        if dry_run:
            return _planned(host, status, steps, started, facts, desired, tls, ca_dir)
        await _execute(executor, host, steps, STEP_TIMEOUT_S)
        await wait_healthy(health_url(entry), health_timeout_s)
        after = await host_facts(executor, host, entry)
        if steps:
            await _write_record(executor, host, root, desired, facts)
    except (DeployError, SSHError) as exc:
        return DeployResult(
            host,
            FAILED,
            time.monotonic() - started,
            str(exc),
            tuple(s.describe() for s in steps),
            certificate=certificate_summary(tls),
        )
    return DeployResult(
        host,
        status,
        time.monotonic() - started,
        steps=tuple(s.describe() for s in steps),
        pid=after.pid,
        version=desired.version,
        fingerprint=desired.fingerprint,
        certificate=certificate_summary(tls),
    )


def _planned(
    host: str,
    status: str,
    steps: list[Step],
    started: float,
    facts: HostFacts,
    desired: Desired,
    tls: NodeTls | None,
    ca_dir: Path | None,
) -> DeployResult:
    """The dry run's result: the steps a deploy would take (first the certificate it would
    issue, with `--ca`)."""
    described = tuple(s.describe() for s in steps)
    if tls is not None and tls.pending and steps:
        note = f"issue a node certificate for {host} from {ca_dir} ({tls.reason})"
        described = (note, *described)
    return DeployResult(
        host,
        status,
        time.monotonic() - started,
        steps=described,
        dry_run=True,
        pid=facts.pid,
        version=desired.version,
        certificate=certificate_summary(tls),
    )


async def _write_record(
    executor: SSHExecutor, host: str, root: str, desired: Desired, facts: HostFacts
) -> None:
    """`path/deploy.json`: what is deployed there (fingerprint, version, how it runs)."""
    record = {
        "fingerprint": desired.fingerprint,
        "version": desired.version,
        "service": "systemd" if facts.systemd else "detached",
    }
    await _execute(
        executor,
        host,
        [WriteFile(f"{root}/deploy.json", json.dumps(record, sort_keys=True) + "\n")],
        STEP_TIMEOUT_S,
    )


def desired_states(
    inventory: Inventory,
    hosts: Iterable[str],
    *,
    inventory_text: str,
    secret: bytes,
    python: str,
    offline: bool,
    cache_dir: Path,
    homes: dict[str, str],
    tls: bool = False,
) -> dict[str, Desired]:
    """The Desired of every host (wheels built once, in `cache_dir`); with `tls`, their node
    configs name the TLS files (the material itself comes per host, after its probe)."""
    cache = cache_dir.expanduser()
    shoal = build_shoal_wheel(cache)
    dependencies = tuple(dependency_wheels(cache)) if offline else ()
    desired = {}
    for host in hosts:
        entry = inventory.hosts[host]
        root = remote_root(entry, homes.get(host, "~"))
        desired[host] = Desired(
            shoal,
            dependencies,
            node_config_text(host, entry, inventory, root, tls=tls),
            inventory_text,
            secret,
            python,
            offline,
        )
    return desired


async def deploy(
    executor: SSHExecutor,
    hosts: Sequence[str],
    *,
    secret: bytes,
    inventory_text: str,
    python: str = "python3",
    offline: bool = False,
    dry_run: bool = False,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    health_timeout_s: float = HEALTH_TIMEOUT_S,
    ca_dir: Path | None = None,
    recorder: DeployRecorder | None = None,
) -> dict[str, DeployResult]:
    """Deploy shoal to every host at once; one result per host. `recorder` records each
    installed or upgraded host in its daemon's audit trail (a problem is noted in the
    result's `audit_problem`, never a failure)."""
    desired, early = await desired_for_hosts(
        executor,
        hosts,
        secret=secret,
        inventory_text=inventory_text,
        python=python,
        offline=offline,
        cache_dir=cache_dir,
        tls=ca_dir is not None,
    )
    todo = [h for h in hosts if h not in early]
    done = await asyncio.gather(
        *(
            deploy_host(
                executor,
                h,
                desired,
                dry_run=dry_run,
                health_timeout_s=health_timeout_s,
                ca_dir=ca_dir,
            )
            for h in todo
        )
    )
    if recorder is not None:
        done = [
            dataclasses.replace(r, audit_problem=await recorder.record(h, r, rolling=False))
            for h, r in zip(todo, done, strict=True)
        ]
    results = {**early, **dict(zip(todo, done, strict=True))}
    return {h: results[h] for h in hosts}


async def desired_for_hosts(
    executor: SSHExecutor,
    hosts: Sequence[str],
    *,
    secret: bytes,
    inventory_text: str,
    python: str,
    offline: bool,
    cache_dir: Path,
    tls: bool,
) -> tuple[dict[str, Desired], dict[str, DeployResult]]:
    """Each host's Desired, and the `failed` result of each host whose home could not be
    read (wheels built once, in a thread)."""
    homes: dict[str, str] = {}
    early: dict[str, DeployResult] = {}
    for host in hosts:
        probe = await executor.run(host, ["sh", "-c", 'echo "$HOME"'], 60.0)
        if probe.ok:
            homes[host] = probe.stdout.strip()
        else:
            reason = probe.error or f"exited {probe.exit_code}"
            early[host] = DeployResult(host, FAILED, probe.duration_s, reason)
    desired = await asyncio.to_thread(
        desired_states,
        executor.inventory,
        [h for h in hosts if h not in early],
        inventory_text=inventory_text,
        secret=secret,
        python=python,
        offline=offline,
        cache_dir=cache_dir,
        homes=homes,
        tls=tls,
    )
    return desired, early


async def undeploy_host(
    executor: SSHExecutor, host: str, *, purge: bool = False, dry_run: bool = False
) -> DeployResult:
    """Stop and remove the service of one host; the data dir stays unless `purge`."""
    started = time.monotonic()
    entry = executor.inventory.hosts[host]
    steps: list[Step] = []
    try:
        facts = await host_facts(executor, host, entry)
        root = remote_root(entry, facts.home)
        if facts.systemd:
            unit = unit_path(entry, facts.home)
            disable = shlex.join(systemctl_argv(entry, "disable", "--now", UNIT_NAME))
            steps += [
                Remote(("sh", "-c", f"{disable} || true"), "stop and disable the unit"),
                Remote(("rm", "-f", unit), "remove the unit"),
            ]
        if facts.alive and facts.pid is not None:
            steps.append(stop_pid_step(facts.pid))
        if purge:
            steps.append(Remote(("rm", "-rf", root), "remove everything, data included"))
        else:
            names = (
                "venv",
                "wheels",
                "node.yaml",
                "inventory.yaml",
                "secret",
                "deploy.json",
                "shoal.pid",
            )
            steps.append(
                Remote(("rm", "-rf", *(f"{root}/{n}" for n in names)), "remove all but the data")
            )
        if not dry_run:
            await _execute(executor, host, steps, STEP_TIMEOUT_S)
    except (DeployError, SSHError) as exc:
        return DeployResult(host, FAILED, time.monotonic() - started, str(exc))
    return DeployResult(
        host,
        REMOVED,
        time.monotonic() - started,
        steps=tuple(s.describe() for s in steps),
        dry_run=dry_run,
    )
