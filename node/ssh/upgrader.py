"""The SSH side of a rolling upgrade (node.ssh.rolling.HostUpgrader): plan and upgrade one host
with `deploy_host`, read the daemon's log tail, record the deploy on the host's daemon."""

from __future__ import annotations

import shlex
from pathlib import Path

from node.errors import DeployError, SSHError
from node.ssh.deploy import DeployRecorder, DeployResult, deploy_host, host_facts
from node.ssh.executor import SSHExecutor
from node.ssh.plan import HEALTH_TIMEOUT_S, UNIT_NAME, Desired, remote_root


async def log_tail(executor: SSHExecutor, host: str, lines: int) -> str:
    """The last `lines` lines of the host daemon's log: its journal under systemd
    (`journalctl -u shoal`), else `path/daemon.log`; the problem when they cannot be read."""
    entry = executor.inventory.hosts[host]
    try:
        facts = await host_facts(executor, host, entry)
    except (DeployError, SSHError) as exc:
        return f"(no log: {exc})"
    if facts.systemd:
        user = () if entry.ssh_user in (None, "root") else ("--user",)
        argv = ["journalctl", *user, "-u", UNIT_NAME, "-n", str(lines), "--no-pager"]
    else:
        argv = ["tail", "-n", str(lines), f"{remote_root(entry, facts.home)}/daemon.log"]
    result = await executor.run(host, argv, 60.0)
    if not result.ok:
        detail = result.error or f"exited {result.exit_code}: {result.stderr.strip()[-200:]}"
        return f"(no log: {shlex.join(argv)}: {detail})"
    return result.stdout.rstrip("\n")


class SshUpgrader:
    """The SSH side of a rolling upgrade (node.ssh.rolling.HostUpgrader): plan and upgrade one
    host with `deploy_host`, read its log tail, record it through `recorder`."""

    def __init__(
        self,
        executor: SSHExecutor,
        desired: dict[str, Desired],
        early: dict[str, DeployResult],
        *,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        ca_dir: Path | None = None,
        recorder: DeployRecorder | None = None,
    ) -> None:
        self._executor = executor
        self._desired = desired
        self._early = early
        self._health_timeout_s = health_timeout_s
        self._ca_dir = ca_dir
        self._recorder = recorder

    async def _deploy(self, host: str, dry_run: bool) -> DeployResult:
        if host in self._early:
            return self._early[host]
        return await deploy_host(
            self._executor,
            host,
            self._desired,
            dry_run=dry_run,
            health_timeout_s=self._health_timeout_s,
            ca_dir=self._ca_dir,
        )

    async def plan(self, host: str) -> DeployResult:
        return await self._deploy(host, dry_run=True)

    async def upgrade(self, host: str) -> DeployResult:
        return await self._deploy(host, dry_run=False)

    async def log_tail(self, host: str, lines: int) -> str:
        return await log_tail(self._executor, host, lines)

    async def record(self, host: str, result: DeployResult, *, rolling: bool) -> str | None:
        if self._recorder is None:
            return None
        return await self._recorder.record(host, result, rolling=rolling)
