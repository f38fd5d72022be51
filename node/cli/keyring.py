"""`shoal keyring generate|list|install|use|remove`: the gossip keys that seal membership
datagrams, changed on every alive member through the coordinator (or on one node, --local)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from config import NodeSettings, read_secret_file
from node.cli.common import (
    EXIT_FAILURE,
    ConfigOption,
    JsonOption,
    NodeOption,
    config_errors,
    console,
    daemon_of,
    fail,
    print_json,
    request_json,
)
from node.errors import BodyError, KeyringError, PeerRequestError
from node.keyring.wire import ChangeAnswer, LocalAnswer
from node.membership.keyring import (
    encode_key,
    key_id,
    new_key,
    read_key_file,
    valid_key_id,
    wrap_key,
    write_key_file,
)
from node.openapi import check_body

Answer = TypeVar("Answer", ChangeAnswer, LocalAnswer)

keyring_app = typer.Typer(
    help="The gossip keyring: keys that encrypt membership datagrams, rotated live.",
    no_args_is_help=True,
)

USAGE_CODES = frozenset({"bad_key", "unknown_key", "key_in_use", "invalid_request"})
"""Refusals that are the caller's mistake: exit 2 (any other refusal exits 1)."""
KEYRING_TIMEOUT_FACTOR = 4
"""A cluster-wide change asks every member in parallel, after a forward to the coordinator."""

LocalOption = Annotated[
    bool,
    typer.Option(
        "--local",
        help="This node only (the one --node names), not every member through the "
        "coordinator: how a node that missed a rotation is given the key.",
    ),
]
KeyIdArgument = Annotated[str, typer.Argument(help="A key id (shoal keyring list).")]


def _bad_input(exc: PeerRequestError) -> bool:
    """A refusal whose code (USAGE_CODES) says the caller's input was wrong."""
    return exc.code in USAGE_CODES


async def _request(
    settings: NodeSettings, method: str, url: str, body: dict[str, str] | None = None
) -> Any:
    """One signed request; a refusal whose code means bad input exits 2, any other error 1."""
    timeout_s = KEYRING_TIMEOUT_FACTOR * settings.timeouts.http_request_s
    return await request_json(settings, method, url, body, timeout_s, usage_error=_bad_input)


def _read(model: type[Answer], answer: object, url: str) -> Answer:
    """The daemon's answer checked by `model`; exit 1 naming the field it cannot read."""
    try:
        return check_body(model, answer)
    except BodyError as exc:
        fail(f"{url}: an answer that cannot be read: {exc.reason}", EXIT_FAILURE)


def _report(answer: ChangeAnswer, as_json: bool) -> None:
    """Print a cluster-wide change; exit 1 naming every member that did not acknowledge."""
    if as_json:
        print_json(answer.to_json())
    else:
        acked = ", ".join(answer.acked) or "none"
        console.print(
            f"{answer.op} {answer.key_id}: acknowledged by {len(answer.acked)} member(s) ({acked})",
            highlight=False,
        )
    failed = answer.failed
    if failed:
        fail(
            [f"{node} did not acknowledge: {reason}" for node, reason in sorted(failed.items())],
            EXIT_FAILURE,
        )


def _local_report(answer: LocalAnswer, op: str, kid: str, as_json: bool) -> None:
    if as_json:
        print_json(answer.to_json())
    else:
        console.print(
            f"{op} {kid} on {answer.node}: keys {', '.join(answer.keys)}; in use {answer.primary}",
            highlight=False,
        )


def _change(
    settings: NodeSettings,
    url: str,
    op: str,
    kid: str,
    body: dict[str, str],
    *,
    local: bool,
    as_json: bool,
) -> None:
    """POST the change `op` (install, use, remove) of key `kid` to every alive member through
    the coordinator, or to the daemon at `url` only (`local`), and report it."""
    path = f"/v1/keyring/local/{op}" if local else f"/v1/keyring/{op}"
    answer = asyncio.run(_request(settings, "POST", f"{url}{path}", body))
    if local:
        _local_report(_read(LocalAnswer, answer, url), op, kid, as_json)
    else:
        _report(_read(ChangeAnswer, answer, url), as_json)


def _check_key_id(kid: str) -> None:
    if not valid_key_id(kid):
        fail(f"{kid!r} is not a key id (16 hex characters; see shoal keyring list)")


@keyring_app.command("generate")
def generate(
    out: Annotated[Path, typer.Option("--out", help="Where the key file goes (mode 600).")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Make a new random 256-bit gossip key in a key file (mode 600) and print its id."""
    if out.exists() and not force:
        fail(f"{out} exists; pass --force to replace it")
    key = new_key()
    try:
        write_key_file(out, key)
    except OSError as exc:
        fail(f"{out}: cannot write the key file: {exc}")
    console.print(f"key {key_id(key)} in {out}", highlight=False)


@keyring_app.command("list")
def list_keys(
    node: NodeOption = None,
    local: LocalOption = False,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Every key id of the cluster (never a key's bytes): how many members hold it and which
    members seal with it; exit 1 when a member did not answer."""
    settings, url = daemon_of(node, config_file)
    if local:
        answer = asyncio.run(_request(settings, "GET", f"{url}/v1/keyring/local"))
        if as_json:
            print_json(answer)
        else:
            for kid in answer["keys"]:
                mark = " (in use)" if kid == answer["primary"] else ""
                console.print(f"{kid}{mark}", highlight=False)
        return
    answer = asyncio.run(_request(settings, "GET", f"{url}/v1/keyring"))
    if as_json:
        print_json(answer)
    else:
        members = answer["members"]
        table = Table("key", "held by", "in use by")
        for key in answer["keys"]:
            users = ", ".join(key["in_use_by"]) or "-"
            table.add_row(key["id"], f"{key['members']}/{len(members)}", users)
        console.print(table)
        for member, state in sorted(members.items()):
            console.print(f"{member}: uses {state['primary']}", highlight=False)
    if answer["failed"]:
        fail(
            [f"{n} did not answer: {why}" for n, why in sorted(answer["failed"].items())],
            EXIT_FAILURE,
        )


@keyring_app.command("install")
def install(
    keyfile: Annotated[Path, typer.Argument(help="A key file (shoal keyring generate).")],
    node: NodeOption = None,
    local: LocalOption = False,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Install a key on every alive member: from then on each accepts datagrams sealed with
    it. Exit 0 when every alive member acknowledged, 1 naming those that did not, 2 for a bad
    key file or when neither the cluster secret nor an operator certificate is at hand. The
    key travels sealed with a key derived from the cluster secret, or, without the secret,
    inside the TLS connection of the operator's certificate (SHOAL_TLS_*)."""
    settings, url = daemon_of(node, config_file)
    try:
        key = read_key_file(keyfile)
    except KeyringError as exc:
        fail(str(exc))
    with config_errors():
        secret = read_secret_file(settings.secret_file) if settings.secret_file else None
    if secret is not None:
        body = {"key": wrap_key(key, secret, settings.cluster_name), "sealed": "secret"}
    elif url.startswith("https://"):  # an operator certificate: the channel protects the key
        body = {"key": encode_key(key), "sealed": "tls"}
    else:
        fail(
            "shoal keyring install needs the cluster secret (secret_file in the config) or an "
            "operator certificate (SHOAL_TLS_CERT, SHOAL_TLS_KEY, SHOAL_TLS_CA): the key must "
            "not cross the network readable"
        )
    _change(settings, url, "install", key_id(key), body, local=local, as_json=as_json)


def _key_id_command(op: str, doc: str) -> Callable[..., None]:
    """The command that changes key KEYID by `op` (use, remove); `doc` is its help."""

    def command(
        kid: KeyIdArgument,
        node: NodeOption = None,
        local: LocalOption = False,
        as_json: JsonOption = False,
        config_file: ConfigOption = None,
    ) -> None:
        _check_key_id(kid)
        settings, url = daemon_of(node, config_file)
        _change(settings, url, op, kid, {"key_id": kid}, local=local, as_json=as_json)

    command.__doc__ = doc
    return command


use = keyring_app.command("use")(
    _key_id_command(
        "use",
        """Seal with key KEYID on every alive member. Refused (nothing changed, exit 1 naming
    them) while a member lacks the key; exit 2 when no member holds it.""",
    )
)
remove = keyring_app.command("remove")(
    _key_id_command(
        "remove",
        """Remove key KEYID from every alive member. The key in use is refused (exit 2): use
    another key first.""",
    )
)
