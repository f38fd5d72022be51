"""`import shoal` works from a script directory holding its own config.py, net.py, wal.py,
health.py, sync.py and node.py (as many ML repositories do), and the package's client signs
requests exactly as the daemon checks them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from config.auth import sign_request
from node import NodeDaemon
from shoal._daemon import DaemonClient, sign
from shoal.errors import DaemonAnswerError, DaemonUnreachableError, ShoalError
from shoal.place import place_from_env
from tests.node.daemons import test_settings

ROOT = Path(__file__).resolve().parents[2]
SHADOWED = ("config", "net", "wal", "health", "sync", "node")


def write_decoys(directory: Path) -> None:
    """A script directory's own modules named like shoal's internal packages: each records
    that it was imported, as a repository's config.py would simply be loaded."""
    for name in SHADOWED:
        (directory / f"{name}.py").write_text(f"DECOY = {name!r}\n")


def test_import_shoal_beside_decoy_modules(tmp_path: Path) -> None:
    write_decoys(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import shoal
            for name in shoal.__all__:
                getattr(shoal, name)
            internal = ("config", "net", "wal", "health", "sync", "node")
            ours = [n for n in internal if n in sys.modules]
            assert not ours, f"import shoal loaded {ours}"
            import config, node
            assert config.DECOY == "config" and node.DECOY == "node"
            print("ok", shoal.__file__)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok "), result.stdout
    assert Path(result.stdout.split()[1]).resolve().is_relative_to(ROOT / "shoal")


def test_the_package_imports_nothing_of_the_internal_packages() -> None:
    for path in sorted((ROOT / "shoal").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for name in SHADOWED:
            where = f"{path.relative_to(ROOT)} imports {name} at module level"
            assert f"\nimport {name}" not in text, where
            assert f"\nfrom {name}" not in text, where


def test_signature_is_the_daemons() -> None:
    secret = b"0123456789abcdef0123456789abcdef"
    args = ("POST", "/v1/training/report?x=1", "1700000000", "ab" * 16, b'{"step":1}')
    assert sign(secret, *args) == sign_request(secret, *args)


async def test_client_speaks_to_a_daemon_with_a_secret(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"s" * 32)
    secret_file.chmod(0o600)
    settings = test_settings(tmp_path, "n1", secret_file=secret_file)
    async with NodeDaemon(settings) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"
        env = {"SHOAL_DAEMON_URL": url, "SHOAL_SECRET_FILE": str(secret_file)}
        client = DaemonClient.from_env(env)
        status = await asyncio.to_thread(client.request, "GET", "/v1/status")
        assert status["node_id"] == "n1"
        with pytest.raises(DaemonAnswerError) as refused:
            await asyncio.to_thread(client.request, "GET", "/v1/no-such-route")
        assert refused.value.status == 404
        unsigned = DaemonClient(url)
        with pytest.raises(DaemonAnswerError) as unsigned_refusal:
            await asyncio.to_thread(unsigned.request, "GET", "/v1/status")
        assert unsigned_refusal.value.status == 401
        client.close()
        unsigned.close()
    with pytest.raises(DaemonUnreachableError):
        await asyncio.to_thread(client.request, "GET", "/v1/status", timeout_s=2.0)


def test_bad_environment_is_named(tmp_path: Path) -> None:
    loose = tmp_path / "secret"
    loose.write_bytes(b"s" * 32)
    loose.chmod(0o644)
    with pytest.raises(ShoalError, match="chmod 600"):
        DaemonClient.from_env({"SHOAL_SECRET_FILE": str(loose)})
    with pytest.raises(ShoalError, match="SHOAL_DAEMON_URL"):
        DaemonClient.from_env({"SHOAL_DAEMON_URL": "ftp://x"})
    with pytest.raises(ShoalError, match="SHOAL_TLS_KEY"):
        DaemonClient.from_env({"SHOAL_TLS_CERT": "/x"})


def test_place_from_torchruns_environment() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    place = place_from_env({**env, "SHOAL_GENERATION": "7", "SHOAL_NODE_ID": "n2"})
    assert (place.rank, place.local_rank, place.world_size, place.generation) == (3, 1, 4, 7)
    assert place.node_id == "n2"
    assert place_from_env(env).generation == 0
    with pytest.raises(ShoalError, match="WORLD_SIZE is not set"):
        place_from_env({"RANK": "0"})
    with pytest.raises(ShoalError, match=r"rank 4 is not in 0\.\.3"):
        place_from_env({**env, "RANK": "4"})
