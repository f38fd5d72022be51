"""The deploy plan: what a host's read-only probe found (HostFacts), what it should run
(Desired), and the steps from one to the other, a pure function (`plan_deploy`)."""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from config import HostEntry, Inventory
from node.ssh.certs import NodeTls, decode_probe_cert, tls_paths, tls_probe_lines
from node.ssh.wheels import Wheel

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
    the text is never shown, only `label`."""

    remote: str
    text: str = field(repr=False)
    mode: int = 0o644
    secret: bool = False
    label: str = "the cluster secret"

    def describe(self) -> str:
        what = self.label if self.secret else f"{len(self.text)} bytes"
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
    tls_cert: bytes | None = None
    tls_key: bool = False


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
    tls: NodeTls | None = None

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
            *self._tls_parts(),
        ):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()

    def _tls_parts(self) -> tuple[str, ...]:
        if self.tls is None:
            return ()
        parts = (self.tls.ca_pem, self.tls.crl_pem, self.tls.cert_pem)
        return ("tls", *(hashlib.sha256(part).hexdigest() for part in parts))


def remote_root(entry: HostEntry, home: str) -> str:
    """The absolute deploy path of a host: its inventory `path` with `~` as `home`."""
    path = entry.path
    if path == "~":
        return home
    if path.startswith("~/"):
        return f"{home.rstrip('/')}/{path[2:]}"
    return path


def node_config_text(
    name: str, entry: HostEntry, inventory: Inventory, root: str, *, tls: bool = False
) -> str:
    """The node config a host runs with: its node id, bind address and port, data dir,
    inventory and secret under `root`; with `tls`, the `tls:` block naming its CA
    certificate, certificate, key and CRL under `root/tls`."""
    settings: dict[str, object] = {
        "node_id": name,
        "bind": entry.internal_ip or entry.address,
        "port": entry.p2p_port,
        "advertise_address": entry.internal_ip or entry.address,
        "cluster_name": inventory.cluster.name,
        "data_dir": f"{root}/data",
        "inventory": f"{root}/inventory.yaml",
        "secret_file": f"{root}/secret",
    }
    if tls:
        settings["tls"] = tls_paths(root).settings()
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
            *tls_probe_lines(),
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
        tls_cert=decode_probe_cert(values.get("tlscert", [""])[0].strip()),
        tls_key=bool(values.get("tlskey")),
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
    folders = [f"{root}/wheels", f"{root}/data"]
    if desired.tls is not None:
        folders.append(f"{root}/tls")
    steps: list[Step] = [Remote(("mkdir", "-p", *folders), "make the directories")]
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
    if desired.tls is not None:
        steps.extend(tls_steps(root, desired.tls))
    if facts.systemd:
        steps.extend(systemd_steps(entry, root))
    else:
        if facts.alive and facts.pid is not None:
            steps.append(stop_pid_step(facts.pid))
        steps.append(start_detached_step(root))
    return status, steps


def tls_steps(root: str, tls: NodeTls) -> list[Step]:
    """Write the CA certificate, the CRL and the node certificate (mode 644) and, when newly
    issued, the node key (mode 600, never shown)."""
    paths = tls_paths(root)
    steps: list[Step] = [
        WriteFile(paths.ca, tls.ca_pem.decode(), 0o644),
        WriteFile(paths.crl, tls.crl_pem.decode(), 0o644),
        WriteFile(paths.cert, tls.cert_pem.decode(), 0o644),
    ]
    if tls.key_pem is not None:
        steps.append(WriteFile(paths.key, tls.key_pem.decode(), 0o600, True, "the node key"))
    return steps


def systemctl_argv(entry: HostEntry, *args: str) -> tuple[str, ...]:
    user = () if entry.ssh_user in (None, "root") else ("--user",)
    return ("systemctl", *user, *args)


def unit_path(entry: HostEntry, home: str) -> str:
    if entry.ssh_user in (None, "root"):
        return f"/etc/systemd/system/{UNIT_NAME}"
    return f"{home}/.config/systemd/user/{UNIT_NAME}"


def systemd_steps(entry: HostEntry, root: str) -> list[Step]:
    home = root.rsplit("/", 1)[0] if entry.path.startswith("~/") else "~"
    unit = unit_path(entry, home)
    return [
        Remote(("mkdir", "-p", unit.rsplit("/", 1)[0]), "make the unit directory"),
        WriteFile(unit, unit_text(root), 0o644),
        Remote(systemctl_argv(entry, "daemon-reload"), "reload systemd"),
        Remote(systemctl_argv(entry, "enable", UNIT_NAME), "enable the unit"),
        Remote(systemctl_argv(entry, "restart", UNIT_NAME), "start (or restart) the unit"),
    ]


def stop_pid_step(pid: int) -> Remote:
    script = (
        'kill "$1" 2>/dev/null; i=0; while kill -0 "$1" 2>/dev/null; do '
        f'i=$((i+1)); [ "$i" -gt {_STOP_WAIT_S * 10} ] && kill -9 "$1"; sleep 0.1; done'
    )
    return Remote(("sh", "-c", script, "sh", str(pid)), "stop the running daemon")


def start_detached_step(root: str) -> Remote:
    inner = (
        f"echo $$ > {shlex.quote(root)}/shoal.pid; exec {shlex.quote(root)}/venv/bin/shoal serve "
        f"--config {shlex.quote(root)}/node.yaml"
    )
    script = (
        f"cd {shlex.quote(root)} && nohup setsid sh -c {shlex.quote(inner)} "
        f">> {shlex.quote(root)}/daemon.log 2>&1 < /dev/null &"
    )
    return Remote(("sh", "-c", script), "start the daemon detached (no systemd) under shoal.pid")
