"""The deploy plan as a pure function of a host's facts: unchanged, upgrade, systemd or not."""

from __future__ import annotations

from pathlib import Path

from config import parse_inventory
from node.ssh.plan import (
    INSTALLED,
    UNCHANGED,
    UPGRADED,
    Desired,
    HostFacts,
    Remote,
    Upload,
    WriteFile,
    parse_facts,
    plan_deploy,
    remote_root,
)
from node.ssh.wheels import Wheel

INVENTORY = parse_inventory(
    {
        "hosts": {
            "gpu-a": {"ssh_host": "10.0.0.1", "ssh_user": "ubuntu", "internal_ip": "192.168.1.1"},
            "gpu-b": {"ssh_host": "10.0.0.2", "ssh_user": "root", "path": "/opt/shoal"},
        }
    }
)


def desired(config: str = "node_id: gpu-a\n") -> Desired:
    shoal = Wheel(Path("/cache/shoal-0.1.0+gabc-py3-none-any.whl"), "aa")
    dep = Wheel(Path("/cache/yarl-1.0-py3-none-any.whl"), "bb")
    return Desired(shoal, (dep,), config, "hosts: {}\n", b"tok-never-shown", "python3", True)


def facts(**fields: object) -> HostFacts:
    base: dict[str, object] = {
        "home": "/home/ubuntu",
        "systemd": False,
        "deployed": None,
        "pid": None,
        "alive": False,
        "wheels": frozenset(),
    }
    return HostFacts(**{**base, **fields})  # type: ignore[arg-type]


def test_fresh_host_gets_every_step_and_detached_start() -> None:
    status, steps = plan_deploy("gpu-a", INVENTORY.hosts["gpu-a"], facts(), desired())
    assert status == INSTALLED
    uploads = [s.remote for s in steps if isinstance(s, Upload)]
    assert uploads == [
        "/home/ubuntu/shoal/wheels/shoal-0.1.0+gabc-py3-none-any.whl",
        "/home/ubuntu/shoal/wheels/yarl-1.0-py3-none-any.whl",
    ]
    install = next(s for s in steps if isinstance(s, Remote) and s.what == "install shoal")
    assert "--no-index" in install.argv
    secret = next(s for s in steps if isinstance(s, WriteFile) and s.secret)
    assert secret.mode == 0o600
    assert "tok-never-shown" not in secret.describe()
    assert "tok-never-shown" not in repr(secret)
    assert "detached" in steps[-1].describe()


def test_same_fingerprint_and_running_is_unchanged_else_upgraded() -> None:
    want = desired()
    deployed = {"fingerprint": want.fingerprint, "service": "detached"}
    entry = INVENTORY.hosts["gpu-a"]
    assert plan_deploy("gpu-a", entry, facts(deployed=deployed, alive=True, pid=7), want) == (
        UNCHANGED,
        [],
    )
    status, steps = plan_deploy("gpu-a", entry, facts(deployed=deployed), want)  # not running
    assert status == UPGRADED
    changed = desired("node_id: gpu-a\nport: 9000\n")
    present = frozenset({want.shoal.name, "yarl-1.0-py3-none-any.whl"})
    status, steps = plan_deploy(
        "gpu-a", entry, facts(deployed=deployed, alive=True, pid=7, wheels=present), changed
    )
    assert status == UPGRADED
    assert not [s for s in steps if isinstance(s, Upload)]  # wheels already there
    assert any("stop the running daemon" in s.describe() and "7" in s.describe() for s in steps)


def test_systemd_hosts_get_a_unit_system_for_root_user_unit_otherwise() -> None:
    _, steps = plan_deploy("gpu-b", INVENTORY.hosts["gpu-b"], facts(systemd=True), desired())
    described = [s.describe() for s in steps]
    assert any("/etc/systemd/system/shoal.service" in d for d in described)
    assert any(d.endswith("systemctl restart shoal.service") for d in described)
    _, steps = plan_deploy("gpu-a", INVENTORY.hosts["gpu-a"], facts(systemd=True), desired())
    described = [s.describe() for s in steps]
    assert any(".config/systemd/user/shoal.service" in d for d in described)
    assert any("systemctl --user enable shoal.service" in d for d in described)


def test_parse_facts_and_remote_root() -> None:
    parsed = parse_facts(
        'home=/root\nsystemd=no\ndeployed={"fingerprint": "f"}\npid=42\nalive=yes\n'
        "wheel=a.whl\nwheel=b.whl\n"
    )
    assert parsed == HostFacts(
        "/root", False, {"fingerprint": "f"}, 42, True, frozenset({"a.whl", "b.whl"})
    )
    assert parse_facts("home=/x\nsystemd=yes\ndeployed=not json\n").deployed is None
    assert remote_root(INVENTORY.hosts["gpu-a"], "/home/u") == "/home/u/shoal"
    assert remote_root(INVENTORY.hosts["gpu-b"], "/root") == "/opt/shoal"
