"""What every `shoal` command shares: consoles, error exits, JSON output, loading settings.

`console` and `err_console` (rich) are made on first use, so a command that prints only JSON
never imports rich."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import ssl
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from config import (
    ConfigError,
    LoadedSettings,
    NodeSettings,
    load_settings,
    read_secret_file,
)
from config.nodeid import NODE_ID_FILE
from config.tls.client import client_scheme, operator_context, server_name
from node.errors import PeerRequestError

if TYPE_CHECKING:
    from rich.console import Console

    from net import PeerClient

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

T = TypeVar("T")
_CONSOLES: dict[str, Console] = {}


def _console(name: str) -> Console:
    """The console `name` (`console`: stdout, `err_console`: stderr), made on first use; 200
    columns off a terminal."""
    made = _CONSOLES.get(name)
    if made is None:
        from rich.console import Console

        stderr = name == "err_console"
        stream = sys.stderr if stderr else sys.stdout
        made = _CONSOLES[name] = Console(stderr=stderr, width=None if stream.isatty() else 200)
    return made


if TYPE_CHECKING:
    console: Console
    err_console: Console
else:

    def __getattr__(name: str) -> Any:
        if name in ("console", "err_console"):
            return _console(name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fail(problems: list[str] | str, code: int = EXIT_USAGE) -> NoReturn:
    """Print each problem as one line on stderr and exit with `code` (2: usage or config)."""
    for line in [problems] if isinstance(problems, str) else problems:
        _console("err_console").print(
            f"shoal: error: {line}", markup=False, highlight=False, soft_wrap=True
        )
    raise typer.Exit(code)


@contextmanager
def config_errors() -> Iterator[None]:
    """Turn a ConfigError into its lines on stderr and exit code 2, never a traceback."""
    try:
        yield
    except ConfigError as exc:
        fail(exc.problems, EXIT_USAGE)


def guarded(fn: Callable[[], T]) -> T:
    with config_errors():
        return fn()
    raise AssertionError("unreachable")  # pragma: no cover


def print_json(data: Any) -> None:
    """One JSON document on stdout, for scripts."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def settings_from(
    config_file: Path | None = None, flags: Mapping[str, object] | None = None
) -> LoadedSettings:
    """Effective settings for a command: defaults < file < environment < the flags given."""
    with config_errors():
        return load_settings(config_file, flags=flags or {})
    raise AssertionError("unreachable")  # pragma: no cover


def node_url(settings: NodeSettings, url: str | None = None) -> str:
    """`url` when given, else the local daemon's API address from the settings; `https://`
    when the command presents a client certificate (SHOAL_TLS_CERT)."""
    chosen = url.rstrip("/") if url else settings.local_url
    return client_scheme(chosen, guarded(operator_context))


def peer_client(settings: NodeSettings, timeout_s: float | None = None) -> PeerClient:
    """The net.PeerClient of a command: signed as `cli-HOSTNAME` when the settings name a
    secret file, presenting the client certificate of SHOAL_TLS_CERT / SHOAL_TLS_KEY /
    SHOAL_TLS_CA when set (an operator's or reader's, for nodes with auth tls), each request
    within `timeout_s` (default the table's http_request_s)."""
    from net import Identity, PeerClient

    secret = None if settings.secret_file is None else read_secret_file(settings.secret_file)
    timeouts = settings.timeouts
    if timeout_s is not None:
        timeouts = timeouts.model_copy(update={"http_request_s": timeout_s})
    context = guarded(operator_context)
    identity = Identity.of_command(secret)
    if context is None:
        return PeerClient(identity, timeouts=timeouts)
    identity = dataclasses.replace(identity, prover=guarded(_operator_prover))
    known = _local_node(settings)

    def tls(address: str) -> tuple[ssl.SSLContext, str]:
        return context, server_name(address, known)  # the local daemon: its node id

    return PeerClient(identity, timeouts=timeouts, tls=tls)


def _operator_prover() -> Callable[[str, str, bytes, str], dict[str, str]]:
    """The proof each request of an operator's command carries (SHOAL_TLS_CERT's key signs
    it), which a node that forwards the request passes on (node.forwarding)."""
    import os

    from config.tls.proof import operator_prover

    return operator_prover(
        Path(os.environ["SHOAL_TLS_CERT"]).expanduser(),
        Path(os.environ["SHOAL_TLS_KEY"]).expanduser(),
    )


def _local_node(settings: NodeSettings) -> dict[str, str]:
    """{HOST:PORT of the local daemon: its node id} when the settings or the data dir name it
    (a server certificate names its node id; the local address is often not among its SANs)."""
    node_id = settings.node_id
    if node_id is None:
        with contextlib.suppress(OSError):
            node_id = (settings.data_dir / NODE_ID_FILE).read_text(encoding="utf-8").strip()
    if not node_id:
        return {}
    return {settings.local_url.split("://", 1)[-1].rstrip("/"): node_id}


def daemon_of(node: str | None, config_file: Path | None) -> tuple[NodeSettings, str]:
    """(settings, daemon URL) of a command: the settings of `config_file` (node_url's
    choice of daemon: `node`, else the local one)."""
    settings = settings_from(config_file).settings
    return settings, node_url(settings, node)


def fetch_json(settings: NodeSettings, url: str, timeout_s: float | None = None) -> Any:
    """`request_json` of one GET, blocking: the same signing, TLS and errors through
    net.BlockingPeerClient, without aiohttp or an event loop (a command that reads one
    document starts in about half the time)."""
    from net import BlockingPeerClient, Identity, split_url

    secret = None if settings.secret_file is None else read_secret_file(settings.secret_file)
    context = guarded(operator_context)
    client = BlockingPeerClient(
        Identity.of_command(secret), timeouts=settings.timeouts, ssl_context=lambda: context
    )
    try:
        base, path_qs = split_url(url)
        with client:
            return client.call_json("GET", base, path_qs, timeout_s=timeout_s)[1]
    except PeerRequestError as exc:
        fail(str(exc), EXIT_FAILURE)


async def request_json(
    settings: NodeSettings,
    method: str,
    url: str,
    body: object = None,
    timeout_s: float | None = None,
    *,
    usage_error: Callable[[PeerRequestError], bool] | None = None,
) -> Any:
    """One signed request to a daemon and its JSON answer; an error answer or an unreachable
    daemon exits 1 with one line naming the URL and the node's own reason (2 when
    `usage_error` says the refusal is the caller's bad input)."""
    from net import split_url

    try:
        base, path_qs = split_url(url)
        async with peer_client(settings, timeout_s) as peers:
            return await peers.request_json(method, base, path_qs, body)
    except PeerRequestError as exc:
        bad_input = usage_error is not None and usage_error(exc)
        fail(str(exc), EXIT_USAGE if bad_input else EXIT_FAILURE)


NodeOption = Annotated[
    str | None, typer.Option("--node", help="Daemon URL; default the local node from the config.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="Config file (YAML); default $SHOAL_CONFIG.")
]
