"""`shoal ca init|issue|revoke|list` run as `python -m node ca ...` in a subprocess."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from config.tls import CertRole, load_certificate, load_crl, role_of, verify_peer_certificate

ROOT = Path(__file__).resolve().parents[2]


def shoal(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "node", "ca", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_init_issue_revoke_list_round_trip(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    _ok(shoal("init", "--dir", ca))
    assert stat.S_IMODE((ca / "ca.key").stat().st_mode) == 0o600
    again = shoal("init", "--dir", ca)
    assert again.returncode == 2
    assert "already holds a CA" in again.stderr
    assert "--force" in again.stderr

    out = _ok(
        shoal(
            "issue", "gpu-1", "--dir", ca, "--role", "node", "--days", "30",
            "--san", "198.18.0.4", "--san", "gpu-1.lan", "--out", tmp_path / "gpu-1",
        )
    )  # fmt: skip
    assert "gpu-1" in out
    assert stat.S_IMODE((tmp_path / "gpu-1" / "gpu-1.key").stat().st_mode) == 0o600
    node = load_certificate(tmp_path / "gpu-1" / "gpu-1.crt")
    ca_cert = load_certificate(tmp_path / "gpu-1" / "ca.crt")
    assert verify_peer_certificate(node, ca_cert).role is CertRole.NODE
    _ok(shoal("issue", "ops", "--dir", ca, "--role", "reader", "--out", tmp_path / "ops"))
    assert role_of(load_certificate(tmp_path / "ops" / "ops.crt")) is CertRole.READER

    listing = json.loads(_ok(shoal("list", "--dir", ca, "--json")))
    rows = {row["name"]: row for row in listing["issued"]}
    assert rows["gpu-1"]["role"] == "node"
    assert rows["gpu-1"]["serial"] == f"{node.serial_number:X}"
    assert rows["gpu-1"]["not_after"] == node.not_valid_after_utc.isoformat()
    assert rows["gpu-1"]["expired"] is False
    assert rows["gpu-1"]["revoked"] is False
    assert listing["crl_number"] == 0

    revoked = _ok(shoal("revoke", "gpu-1", "--dir", ca))
    assert f"{node.serial_number:X}" in revoked
    listing = json.loads(_ok(shoal("list", "--dir", ca, "--json")))
    rows = {row["name"]: row for row in listing["issued"]}
    assert rows["gpu-1"]["revoked"] is True
    assert rows["ops"]["revoked"] is False
    assert listing["crl_number"] == 1
    crl = load_crl(ca / "crl.pem")
    assert crl.get_revoked_certificate_by_serial_number(node.serial_number) is not None

    table = _ok(shoal("list", "--dir", ca))
    assert "gpu-1" in table
    assert "reader" in table


def test_revoke_refuses_an_unknown_name_or_serial(tmp_path: Path) -> None:
    _ok(shoal("init", "--dir", tmp_path))
    result = shoal("revoke", "gpu-9", "--dir", tmp_path)
    assert result.returncode == 2
    assert "'gpu-9': no certificate of that name or serial" in result.stderr
    assert "shoal ca list" in result.stderr
    assert "Traceback" not in result.stderr


def test_usage_errors_exit_2_saying_what_to_do(tmp_path: Path) -> None:
    missing = shoal("issue", "gpu-1", "--dir", tmp_path, "--role", "node", "--out", tmp_path)
    assert missing.returncode == 2
    assert f"run `shoal ca init --dir {tmp_path}` first" in missing.stderr
    listing = shoal("list", "--dir", tmp_path)
    assert listing.returncode == 2
    assert "shoal ca init" in listing.stderr
    (tmp_path / "file").write_text("x")
    bad_dir = shoal("init", "--dir", tmp_path / "file")
    assert bad_dir.returncode == 2
    assert "not a directory" in bad_dir.stderr
    _ok(shoal("init", "--dir", tmp_path / "ca"))
    bad_role = shoal(
        "issue", "gpu-1", "--dir", tmp_path / "ca", "--role", "admin", "--out", tmp_path / "o"
    )
    assert bad_role.returncode == 2
    assert "--role 'admin': use node, operator or reader" in bad_role.stderr
    bad_days = shoal(
        "issue", "gpu-1", "--dir", tmp_path / "ca", "--role", "node", "--days", "0",
        "--out", tmp_path / "o",
    )  # fmt: skip
    assert bad_days.returncode == 2
    assert "--days 0" in bad_days.stderr
    assert "1 to 3650 days" in bad_days.stderr
    for result in (missing, listing, bad_dir, bad_role, bad_days):
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["init", "issue", "revoke", "list"])
def test_every_command_has_help(command: str) -> None:
    text = _ok(shoal(command, "--help"))
    assert "--dir" in text
