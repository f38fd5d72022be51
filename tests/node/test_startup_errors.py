"""`shoal serve` as a subprocess: each start-up failure a user can cause is one line, exit 2."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from config import NodeSettings
from node.errors import StartupError
from node.startup import check_port_free, prepare_data_dir
from sync import RecordStores

ROOT = Path(__file__).resolve().parents[2]
EXIT_USAGE = 2


def serve(
    data_dir: Path, port: int, *, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run `shoal serve` (after `prefix`) until it exits: each case fails during start-up."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SHOAL_") and key != "NOTIFY_SOCKET"
    }
    env["PYTHONPATH"] = str(ROOT)
    command = [
        *prefix,
        sys.executable,
        "-m",
        "node",
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--node-id",
        "startup-test",
        "--no-mdns",
    ]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, no traceback, exactly one `shoal: error:` line holding every fragment."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("shoal: error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert result.returncode == EXIT_USAGE, result.stderr
    return errors[0]


def free_port() -> int:
    """A port number free for both TCP and UDP on 127.0.0.1 right now."""
    while True:
        with socket.socket() as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


@contextmanager
def tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `mount_point` for the block (needs root; skips with the reason)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill_up(filler: Path) -> None:
    """Write `filler` until its filesystem has no space left."""
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


def assert_nothing_opened(result: subprocess.CompletedProcess[str], data_dir: Path) -> None:
    """A busy port is found first: at most 3 lines on stderr, every one the error (no log
    line), and no WAL, record store or database in the data dir."""
    lines = result.stderr.splitlines()
    assert len(lines) <= 3, result.stderr
    assert all(line.startswith("shoal: error:") for line in lines), result.stderr
    opened = [
        path.name
        for path in data_dir.rglob("*")
        if path.name == "wal" or ".db" in path.name or ".sqlite" in path.name
    ]
    assert opened == [], f"opened before the port was checked: {opened}"


def test_tcp_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = serve(tmp_path / "data", port)
    assert_one_line(result, f"cannot listen on 127.0.0.1:{port}: Address already in use", "--port")
    assert_nothing_opened(result, tmp_path / "data")


def test_udp_membership_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", port))
        result = serve(tmp_path / "data", port)
    assert_one_line(result, f"membership UDP on 127.0.0.1:{port}", "UDP port", "--port")
    assert_nothing_opened(result, tmp_path / "data")


def test_a_port_in_time_wait_is_free(tmp_path: Path) -> None:
    """The probe binds as the listener does (SO_REUSEADDR): a port whose last connection is in
    TIME_WAIT, as after a quick restart, is not reported busy."""
    port = free_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server side closes first: its end waits in TIME_WAIT
            client.recv(1)
    check_port_free("127.0.0.1", port)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", 0)


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.write_text("not a directory\n")
    result = serve(data_dir, free_port())
    assert_one_line(result, f"data dir {data_dir} is a file", "--data-dir")


def test_data_dir_not_writable(tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run the daemon without CAP_DAC_OVERRIDE")
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    os.chown(data_dir, 65534, 65534)  # someone else's directory, and we may not override that
    without_override = (setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--")
    result = serve(data_dir, free_port(), prefix=without_override)
    assert_one_line(result, f"data dir {data_dir} is not writable", "permission denied")


def test_read_only_data_dir_says_read_only(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro,size=1m") as data_dir:
        result = serve(data_dir, free_port())
    assert_one_line(result, f"data dir {data_dir} is read-only", "read-write")


def test_full_disk_at_start_up(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=1m") as mount_point:
        fill_up(mount_point / "filler")
        result = serve(mount_point / "data", free_port())
    assert_one_line(result, f"data dir {mount_point / 'data'}: the disk is full", "bytes free")


def test_the_data_dir_must_take_a_write_before_anything_starts(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=1m") as mount_point:
        (mount_point / "data").mkdir()
        fill_up(mount_point / "filler")
        with pytest.raises(StartupError, match=r"the disk is full \(\d+ bytes free\)"):
            prepare_data_dir(mount_point / "data")
    prepare_data_dir(tmp_path / "new" / "data")  # created, written, and the probe removed
    assert list((tmp_path / "new" / "data").iterdir()) == []


def test_record_store_locked_by_another_process(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    games = RecordStores.for_settings(NodeSettings(data_dir=data_dir)).paths["games"]
    games.parent.mkdir(parents=True)
    lock_path = games.with_name(games.name + ".lock")
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = serve(data_dir, free_port())
    assert_one_line(result, f"{games}: locked by another process", "--data-dir")
