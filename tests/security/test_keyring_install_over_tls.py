"""Finding 12: in an `auth: tls` cluster (whose nodes keep the cluster secret for their local
processes) an operator holding only an operator certificate got `400 bad_key` from `shoal
keyring install`: the command sealed the key with a secret it did not have. Now, without the
secret, the key travels plain inside the TLS connection of the certificate (`sealed: tls`),
which a node takes only over TLS; with neither at hand the command says what is missing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from node.cli.app import app
from node.daemon import NodeDaemon
from node.membership.keyring import encode_key, key_id, new_key, write_key_file
from tests.node.daemons import test_settings
from tests.node.jobs.helpers import signed_session, write_secret
from tests.node.tls_pki import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), nodes=("a",))


async def _shoal(*argv: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, app, ["keyring", *argv])


async def test_keyring_install_over_tls_with_an_operator_certificate_alone(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = write_secret(tmp_path)  # the node's, for its local processes
    settings = test_settings(tmp_path, "a", tls=pki.node_tls("a"), secret_file=secret)
    keyfile = tmp_path / "new.key"
    key = new_key()
    write_key_file(keyfile, key)
    operator = tmp_path / "operator.yaml"  # the operator's config: no secret_file
    operator.write_text(json.dumps({"cluster_name": settings.cluster_name}))
    async with NodeDaemon(settings) as daemon:
        url = f"https://127.0.0.1:{daemon.port}"
        monkeypatch.setenv("SHOAL_TLS_CERT", str(pki.cert("alice")))
        monkeypatch.setenv("SHOAL_TLS_KEY", str(pki.key("alice")))
        monkeypatch.setenv("SHOAL_TLS_CA", str(pki.ca_cert))
        done = await _shoal(
            "install", str(keyfile), "--local", "--node", url, "--config", str(operator)
        )
        assert done.exit_code == 0, done.output
        listed = await _shoal("list", "--local", "--json", "--node", url, "--config", str(operator))
        assert listed.exit_code == 0, listed.output
        assert key_id(key) in listed.output
        # a plain key over plain HTTP is refused by a node that holds a secret
        other = new_key()
        body = {"key": encode_key(other), "sealed": "tls"}
        async with (
            signed_session() as session,
            session.post(
                f"http://127.0.0.1:{daemon.port}/v1/keyring/local/install", json=body
            ) as answer,
        ):
            assert answer.status == 400, await answer.text()
            assert (await answer.json())["error"] == "bad_key"
        for name in ("SHOAL_TLS_CERT", "SHOAL_TLS_KEY", "SHOAL_TLS_CA"):
            monkeypatch.delenv(name)
        refused = await _shoal(
            "install", str(keyfile), "--local", "--node", f"http://127.0.0.1:{daemon.port}",
            "--config", str(operator),
        )  # fmt: skip
        assert refused.exit_code == 2, refused.output
        assert "needs the cluster secret" in refused.output
        assert "operator certificate" in refused.output
