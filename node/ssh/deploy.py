"""`shoal deploy` and `shoal undeploy`: put an authenticated daemon on inventory hosts over SSH.

Per host: probe (read only), plan (a pure function of the probe and the wanted state), then
unless dry-run: push wheels over SFTP, create or reuse a venv, install, write the node config,
inventory and secret (mode 600), start under systemd or detached with a pid file, wait for
/v1/health, and record what was deployed in `<path>/deploy.json` so a second run is `unchanged`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncssh
import yaml

from config import HostEntry, Inventory
from node.errors import DeployError, SSHError
from node.ssh.executor import SSHExecutor
from node.ssh.wheels import Wheel, build_shoal_wheel, dependency_wheels

INSTALLED = "installed"
UPGRADED = "upgraded"
UNCHANGED = "unchanged"
FAILED = "failed"
REMOVED = "removed"
DEFAULT_CACHE_DIR = Path("~/.cache/shoal/deploy")
HEALTH_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 600.0
UNIT_NAME = "shoal.service"
_STOP_WAIT_S = 15


@dataclass(frozen=True)
class Upload:
    """Copy a local file to `remote` over SFTP."""

    local: Path
    remote: str

    def describe(self) -> str:
        return f"push {self.local.name} -> {self.remote}"


@dataclass(frozen=True)
class WriteFile:
    """Write `text` to `remote` with `mode` (atomically: a temp name, then rename). `secret`:
    the text is never shown."""

    remote: str
    text: str = field(repr=False)
    mode: int = 0o644
    secret: bool = False

    def describe(self) -> str:
        what = "the cluster secret" if self.secret else f"{len(self.text)} bytes"
        return f"write {self.remote} (mode {self.mode:o}, {what})"


@dataclass(frozen=True)
class Remote:
    """Run an argv on the host; it must exit 0."""

    argv: tuple[str, ...]
    what: str

    def describe(self) -> str:
        return f"{self.what}: {shlex.join(self.argv)}"


Step = Upload | WriteFile | Remote


@dataclass(frozen=True)
class HostFacts:
    """What the read-only probe found on a host."""

    home: str
    systemd: bool
    deployed: dict[str, object] | None
    pid: int | None
    alive: bool
    wheels: frozenset[str]


@dataclass(frozen=True)
class Desired:
    """What a host should run: the wheels, the config texts and their fingerprint."""

    shoal: Wheel
    dependencies: tuple[Wheel, ...]
    node_config: str
    inventory_text: str
    secret: bytes = field(repr=False)
    python: str
    offline: bool

    @property
    def version(self) -> str:
        return self.shoal.name.split("-")[1]

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for part in (
            self.shoal.sha256,
            *sorted(w.sha256 for w in self.dependencies),
            self.node_config,
            self.inventory_text,
            hashlib.sha256(self.secret).hexdigest(),
            self.python,
        ):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()


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
        }


def remote_root(entry: HostEntry, home: str) -> str:
    """The absolute deploy path of a host: its inventory `path` with `~` as `home`."""
    path = entry.path
    if path == "~":
        return home
    if path.startswith("~/"):
        return f"{home.rstrip('/')}/{path[2:]}"
    return path


def node_config_text(name: str, entry: HostEntry, inventory: Inventory, root: str) -> str:
    """The node config a host runs with: its node id, bind address and port, data dir,
    inventory and secret under `root`."""
    settings = {
        "node_id": name,
        "bind": entry.internal_ip or entry.address,
        "port": entry.p2p_port,
        "advertise_address": entry.internal_ip or entry.address,
        "cluster_name": inventory.cluster.name,
        "data_dir": f"{root}/data",
        "inventory": f"{root}/inventory.yaml",
        "secret_file": f"{root}/secret",
    }
    return yaml.safe_dump(settings, sort_keys=True)


def probe_script(root_path: str) -> str:
    """A read-only sh script printing the facts of a host as `key=value` lines."""
    home_rel = root_path[2:] if root_path.startswith("~/") else None
    root = f'"$HOME"/{shlex.quote(home_rel)}' if home_rel else shlex.quote(root_path)
    if root_path == "~":
        root = '"$HOME"'
    return "\n".join(
        [
            'echo "home=$HOME"',
            f"r={root}",
            "if [ -d /run/systemd/system ]; then echo systemd=yes; else echo systemd=no; fi",
            'if [ -f "$r/deploy.json" ]; then'
            ' echo "deployed=$(tr -d "\\n" < "$r/deploy.json")"; fi',
            'if [ -f "$r/shoal.pid" ]; then p=$(cat "$r/shoal.pid"); echo "pid=$p";'
            ' if kill -0 "$p" 2>/dev/null; then echo alive=yes; fi; fi',
            'if [ -d "$r/wheels" ]; then for w in "$r"/wheels/*.whl; do'
            ' [ -f "$w" ] && echo "wheel=$(basename "$w")"; done; fi',
            "true",
        ]
    )


def parse_facts(output: str) -> HostFacts:
    """The HostFacts of the probe script's output."""
    values: dict[str, list[str]] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values.setdefault(key, []).append(value)
    deployed = None
    if values.get("deployed"):
        try:
            loaded = json.loads(values["deployed"][0])
            deployed = loaded if isinstance(loaded, dict) else None
        except ValueError:
            deployed = None
    pid_text = values.get("pid", [""])[0].strip()
    return HostFacts(
        home=values.get("home", [""])[0],
        systemd=values.get("systemd", ["no"])[0] == "yes",
        deployed=deployed,
        pid=int(pid_text) if pid_text.isdigit() else None,
        alive=bool(values.get("alive")),
        wheels=frozenset(values.get("wheel", [])),
    )


def unit_text(root: str) -> str:
    """The systemd unit of a deployed node."""
    return "\n".join(
        [
            "[Unit]",
            "Description=shoal node daemon (deployed by shoal deploy)",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            "Type=notify",
            "NotifyAccess=main",
            f"WorkingDirectory={root}",
            f"ExecStart={root}/venv/bin/shoal serve --config {root}/node.yaml",
            "Restart=on-failure",
            "RestartSec=5",
            "TimeoutStopSec=15",
            "",
            "[Install]",
            "WantedBy=default.target",
            "",
        ]
    )


def plan_deploy(
    name: str, entry: HostEntry, facts: HostFacts, desired: Desired
) -> tuple[str, list[Step]]:
    """(status, steps) to bring a host from `facts` to `desired`; no steps when unchanged."""
    root = remote_root(entry, facts.home)
    fingerprint = desired.fingerprint
    previous = facts.deployed or {}
    running = facts.alive or (facts.systemd and previous.get("service") == "systemd")
    if previous.get("fingerprint") == fingerprint and running:
        return UNCHANGED, []
    status = UPGRADED if previous else INSTALLED
    steps: list[Step] = [
        Remote(("mkdir", "-p", f"{root}/wheels", f"{root}/data"), "make the directories")
    ]
    for wheel in (desired.shoal, *desired.dependencies):
        if wheel.name not in facts.wheels:
            steps.append(Upload(wheel.path, f"{root}/wheels/{wheel.name}"))
    venv_python = f"{root}/venv/bin/python"
    steps.append(
        Remote(
            (
                "sh",
                "-c",
                f'test -x "$1" || {shlex.quote(desired.python)} -m venv "$2"',
                "sh",
                venv_python,
                f"{root}/venv",
            ),
            "create the venv unless it exists",
        )
    )
    install = [venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if desired.offline:
        install.append("--no-index")
    install += ["--find-links", f"{root}/wheels", f"shoal=={desired.version}"]
    steps.append(Remote(tuple(install), "install shoal"))
    steps.append(WriteFile(f"{root}/inventory.yaml", desired.inventory_text, 0o644))
    steps.append(WriteFile(f"{root}/node.yaml", desired.node_config, 0o600))
    steps.append(WriteFile(f"{root}/secret", desired.secret.decode(), 0o600, secret=True))
    if facts.systemd:
        steps.extend(_systemd_steps(entry, root))
    else:
        if facts.alive and facts.pid is not None:
            steps.append(_stop_pid(facts.pid))
        steps.append(_start_detached(root))
    return status, steps


def _systemctl(entry: HostEntry, *args: str) -> tuple[str, ...]:
    user = () if entry.ssh_user in (None, "root") else ("--user",)
    return ("systemctl", *user, *args)


def _unit_path(entry: HostEntry, home: str) -> str:
    if entry.ssh_user in (None, "root"):
        return f"/etc/systemd/system/{UNIT_NAME}"
    return f"{home}/.config/systemd/user/{UNIT_NAME}"


def _systemd_steps(entry: HostEntry, root: str) -> list[Step]:
    home = root.rsplit("/", 1)[0] if entry.path.startswith("~/") else "~"
    unit = _unit_path(entry, home)
    return [
        Remote(("mkdir", "-p", unit.rsplit("/", 1)[0]), "make the unit directory"),
        WriteFile(unit, unit_text(root), 0o644),
        Remote(_systemctl(entry, "daemon-reload"), "reload systemd"),
        Remote(_systemctl(entry, "enable", UNIT_NAME), "enable the unit"),
        Remote(_systemctl(entry, "restart", UNIT_NAME), "start (or restart) the unit"),
    ]


def _stop_pid(pid: int) -> Remote:
    script = (
        'kill "$1" 2>/dev/null; i=0; while kill -0 "$1" 2>/dev/null; do '
        f'i=$((i+1)); [ "$i" -gt {_STOP_WAIT_S * 10} ] && kill -9 "$1"; sleep 0.1; done'
    )
    return Remote(("sh", "-c", script, "sh", str(pid)), "stop the running daemon")


def _start_detached(root: str) -> Remote:
    inner = (
        f"echo $$ > {shlex.quote(root)}/shoal.pid; exec {shlex.quote(root)}/venv/bin/shoal serve "
        f"--config {shlex.quote(root)}/node.yaml"
    )
    script = (
        f"cd {shlex.quote(root)} && nohup setsid sh -c {shlex.quote(inner)} "
        f">> {shlex.quote(root)}/daemon.log 2>&1 < /dev/null &"
    )
    return Remote(("sh", "-c", script), "start the daemon detached (no systemd) under shoal.pid")


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
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                last = str(exc) or type(exc).__name__
            await asyncio.sleep(0.2)
    raise DeployError(f"{url} not healthy within {timeout_s:g}s ({last}); see daemon.log")


def health_url(entry: HostEntry) -> str:
    """The /v1/health URL of a host's daemon, through its inventory address."""
    return f"http://{entry.address}:{entry.p2p_port}/v1/health"


async def _facts(executor: SSHExecutor, host: str, entry: HostEntry) -> HostFacts:
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
) -> DeployResult:
    """Deploy to one host; every failure is this host's `failed` result."""
    started = time.monotonic()
    entry = executor.inventory.hosts[host]
    steps: list[Step] = []
    try:
        facts = await _facts(executor, host, entry)
        root = remote_root(entry, facts.home)
        desired = desired_for[host]
        status, steps = plan_deploy(host, entry, facts, desired)
        if dry_run:
            return DeployResult(
                host,
                status,
                time.monotonic() - started,
                steps=tuple(s.describe() for s in steps),
                dry_run=True,
                pid=facts.pid,
            )
        await _execute(executor, host, steps, STEP_TIMEOUT_S)
        await wait_healthy(health_url(entry), health_timeout_s)
        after = await _facts(executor, host, entry)
        if steps:
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
    except (DeployError, SSHError) as exc:
        return DeployResult(
            host, FAILED, time.monotonic() - started, str(exc), tuple(s.describe() for s in steps)
        )
    return DeployResult(
        host,
        status,
        time.monotonic() - started,
        steps=tuple(s.describe() for s in steps),
        pid=after.pid,
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
) -> dict[str, Desired]:
    """The Desired of every host (wheels built once, in `cache_dir`)."""
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
            node_config_text(host, entry, inventory, root),
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
) -> dict[str, DeployResult]:
    """Deploy shoal to every host at once; one result per host."""
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
    )
    todo = [h for h in hosts if h not in early]
    done = await asyncio.gather(
        *(
            deploy_host(executor, h, desired, dry_run=dry_run, health_timeout_s=health_timeout_s)
            for h in todo
        )
    )
    results = {**early, **dict(zip(todo, done, strict=True))}
    return {h: results[h] for h in hosts}


async def undeploy_host(
    executor: SSHExecutor, host: str, *, purge: bool = False, dry_run: bool = False
) -> DeployResult:
    """Stop and remove the service of one host; the data dir stays unless `purge`."""
    started = time.monotonic()
    entry = executor.inventory.hosts[host]
    steps: list[Step] = []
    try:
        facts = await _facts(executor, host, entry)
        root = remote_root(entry, facts.home)
        if facts.systemd:
            unit = _unit_path(entry, facts.home)
            steps += [
                Remote(
                    (
                        "sh",
                        "-c",
                        f"{shlex.join(_systemctl(entry, 'disable', '--now', UNIT_NAME))} || true",
                    ),
                    "stop and disable the unit",
                ),
                Remote(("rm", "-f", unit), "remove the unit"),
            ]
        if facts.alive and facts.pid is not None:
            steps.append(_stop_pid(facts.pid))
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
