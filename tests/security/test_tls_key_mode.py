"""Finding 9: a TLS key readable by group or others is refused, as the secret file is: the
node's `tls.key` stops the daemon (and a reload keeps the material it had), a command's
SHOAL_TLS_KEY exits naming the variable."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from config import ConfigError
from config.tls import operator_context
from node.daemon import NodeDaemon
from node.identity import open_tls
from tests.node.daemons import test_settings
from tests.node.tls_pki import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), nodes=("a",))


def test_tls_key_mode_readable_by_others_stops_the_node(tmp_path: Path, pki: Pki) -> None:
    key = tmp_path / "a.key"
    shutil.copy(pki.key("a"), key)
    key.chmod(0o644)
    tls = {**pki.node_tls("a"), "key": str(key)}
    with pytest.raises(ConfigError) as caught:
        asyncio.run(NodeDaemon(test_settings(tmp_path, "a", tls=tls)).start())
    assert "tls.key" in str(caught.value)
    assert f"chmod 600 {key}" in str(caught.value)
    key.chmod(0o600)
    settings = test_settings(tmp_path, "a", tls=tls, auth="tls")
    contexts = open_tls(settings, "a")
    assert contexts is not None
    key.chmod(0o640)
    assert not contexts.reload("test"), "a shared key is not loaded on reload either"


def test_tls_key_mode_of_a_command_is_checked(tmp_path: Path, pki: Pki) -> None:
    key = tmp_path / "alice.key"
    shutil.copy(pki.key("alice"), key)
    key.chmod(0o604)
    env = {"SHOAL_TLS_CERT": str(pki.cert("alice")), "SHOAL_TLS_KEY": str(key)}
    env["SHOAL_TLS_CA"] = str(pki.ca_cert)
    with pytest.raises(ConfigError, match=r"SHOAL_TLS_KEY: .* chmod 600"):
        operator_context(env)
    key.chmod(0o600)
    assert operator_context(env) is not None
