"""sync's one translation table: library errors become the most specific SyncError, chained."""

from __future__ import annotations

import errno
import pickle
import sqlite3
from pathlib import Path

import aiohttp
import asyncssh
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sync import (
    FileTransferError,
    FileTransferTimeoutError,
    RecordRequestError,
    RecordRequestTimeoutError,
    SshAuthError,
    SshHostKeyError,
    StoreFullError,
    StoreLockedError,
    StoreWriteError,
    SyncError,
    is_disk_full,
    sync_error,
    translated,
)


def test_a_timeout_is_the_timeout_subclass_of_its_family() -> None:
    request = sync_error(TimeoutError(), "http://n/v1/records", RecordRequestError)
    assert type(request) is RecordRequestTimeoutError
    assert isinstance(request, TimeoutError)
    transfer = sync_error(aiohttp.ServerTimeoutError("slow"), "peer", FileTransferError)
    assert type(transfer) is FileTransferTimeoutError
    assert "timed out" in str(transfer)


def test_a_full_disk_is_store_full_with_path_and_free_bytes(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    for exc in (
        OSError(errno.ENOSPC, "No space left on device"),
        sqlite3.OperationalError("database or disk is full"),
    ):
        error = sync_error(exc, f"{db}: cannot commit", StoreWriteError, path=db)
        assert isinstance(error, StoreFullError)
        assert error.path == db
        assert isinstance(error.free_bytes, int)
        assert f"{error.free_bytes} bytes free" in str(error)
        assert pickle.loads(pickle.dumps(error)).free_bytes == error.free_bytes
    plain = sync_error(sqlite3.OperationalError("disk I/O error"), "x", StoreWriteError, path=db)
    assert type(plain) is StoreWriteError


def test_disk_full_is_found_through_the_chain() -> None:
    outer = RuntimeError("wrapped")
    outer.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))


def test_asyncssh_refusals_are_host_key_and_auth_errors() -> None:
    host_key = sync_error(asyncssh.HostKeyNotVerifiable("unknown key"), "h1", FileTransferError)
    assert isinstance(host_key, SshHostKeyError)
    auth = sync_error(asyncssh.PermissionDenied("no"), "h1", FileTransferError)
    assert isinstance(auth, SshAuthError)


def test_status_of_an_http_error_is_kept() -> None:
    url = URL("http://n/v1/records/games")
    info = aiohttp.RequestInfo(url, "POST", CIMultiDictProxy(CIMultiDict()), url)
    exc = aiohttp.ClientResponseError(info, (), status=502, message="Bad Gateway")
    error = sync_error(exc, "http://n", RecordRequestError)
    assert type(error) is RecordRequestError
    assert error.status == 502


def test_translated_chains_library_errors_and_leaves_others() -> None:
    cause = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    with (
        pytest.raises(RecordRequestError, match="http://n: Connection reset") as info,
        translated("http://n", RecordRequestError),
    ):
        raise cause
    assert info.value.__cause__ is cause
    with pytest.raises(KeyError), translated("http://n", RecordRequestError):
        raise KeyError("not a library error")
    own = StoreLockedError("/d/g.db", "/d/g.db.lock")
    with pytest.raises(StoreLockedError) as kept, translated("x", StoreWriteError):
        raise own
    assert kept.value is own
    assert isinstance(own, SyncError)
    assert "locked by another process" in str(own)
