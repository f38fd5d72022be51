"""One error tree per package: every exception class defined anywhere in config, net, wal,
health, sync or node lives in that package's errors.py (or is private) and derives from its one
base."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import config.errors
import health.errors
import net.errors
import node.errors
import sync.errors
import wal.errors

BASES: dict[str, type[Exception]] = {
    "config": config.errors.ConfigPackageError,
    "net": net.errors.NetError,
    "wal": wal.errors.WalError,
    "health": health.errors.HealthError,
    "sync": sync.errors.SyncError,
    "node": node.errors.NodeError,
}
SKIPPED_MODULES = ("__main__",)


def modules_of(package: str) -> list[str]:
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not info.name.endswith(SKIPPED_MODULES):
            names.append(info.name)
    return names


def exception_classes(package: str) -> list[type[BaseException]]:
    found = []
    for name in modules_of(package):
        module = importlib.import_module(name)
        for value in vars(module).values():
            is_exception = isinstance(value, type) and issubclass(value, BaseException)
            if is_exception and value.__module__ == name:
                found.append(value)
    return found


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_error_class_derives_from_the_package_base(package: str) -> None:
    base = BASES[package]
    classes = exception_classes(package)
    assert base in classes
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, base)]
    assert strays == [], f"{package}: not under {base.__name__}: {strays}"


@pytest.mark.parametrize("package", sorted(BASES))
def test_public_error_classes_live_in_the_package_errors_module(package: str) -> None:
    elsewhere = [
        f"{c.__module__}.{c.__qualname__}"
        for c in exception_classes(package)
        if c.__module__ != f"{package}.errors" and not c.__name__.startswith("_")
    ]
    assert elsewhere == [], f"{package}: error classes outside {package}/errors.py: {elsewhere}"


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_public_error_class_is_exported_from_the_package(package: str) -> None:
    errors = importlib.import_module(f"{package}.errors")
    root = importlib.import_module(package)
    missing = [
        c.__name__
        for c in exception_classes(package)
        if c.__module__ == errors.__name__
        and not c.__name__.startswith("_")
        and getattr(root, c.__name__, None) is not c
    ]
    assert missing == [], f"{package}/__init__.py does not export {missing}"


def test_old_import_places_still_work() -> None:
    from node.errors import ElectionError, LauncherError, PlanError, WireError
    from node.training.groups import GroupError, MasterUnreachable, RendezvousError
    from sync.errors import FileSyncError, InsufficientSpaceError, SshAuthError, SshHostKeyError

    for cls in (ElectionError, PlanError, WireError, GroupError, LauncherError):
        assert cls.__module__ == "node.errors"
    assert issubclass(MasterUnreachable, GroupError)
    assert issubclass(RendezvousError, GroupError)
    for moved in (FileSyncError, InsufficientSpaceError, SshHostKeyError, SshAuthError):
        assert moved.__module__ == "sync.errors"


def test_the_peer_errors_moved_to_net_and_keep_their_old_names() -> None:
    import node
    from node.errors import PeerRequestError, PeerTimeoutError, RetryLater, peer_error

    assert PeerRequestError is net.errors.PeerRequestError is node.PeerRequestError
    assert PeerTimeoutError is net.errors.PeerTimeoutError is node.PeerTimeoutError
    assert RetryLater is net.errors.RetryLater is node.RetryLater
    assert peer_error is net.errors.peer_error
