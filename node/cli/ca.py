"""`shoal ca init|issue|revoke|list`: the cluster CA that gives every node, operator and reader a
certificate naming its identity (CN) and role (OU)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from config import CaError
from config.tls import (
    DEFAULT_CA_DAYS,
    DEFAULT_DAYS,
    CertRole,
    init_ca,
    issue_certificate,
    load_ca,
    read_index,
    revoke,
    serial_text,
)
from node.cli.common import EXIT_USAGE, JsonOption, console, fail, print_json

ca_app = typer.Typer(
    help="The cluster CA: issue, revoke and list node, operator and reader certificates.",
    no_args_is_help=True,
)

DirOption = Annotated[
    Path, typer.Option("--dir", help="The CA's directory (ca.key, ca.crt, crl.pem, index.json).")
]


@ca_app.command("init")
def ca_init(
    directory: DirOption,
    days: Annotated[
        int, typer.Option("--days", help="How long the CA certificate is valid.")
    ] = DEFAULT_CA_DAYS,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace an existing CA (its certificates stop verifying)."),
    ] = False,
) -> None:
    """Make a cluster CA in DIR: an EC P-256 key (ca.key, mode 600), a self-signed ca.crt, an
    empty index and CRL. Refuses a DIR that already holds a CA unless --force."""
    try:
        ca = init_ca(directory, force=force, days=days)
    except CaError as exc:
        fail(exc.problems, EXIT_USAGE)
    subject = ca.cert.subject.rfc4514_string()
    console.print(f"CA {subject} in {directory}", highlight=False)
    console.print(f"keep {directory / 'ca.key'} secret; copy ca.crt to every node", highlight=False)


@ca_app.command("issue")
def ca_issue(
    name: Annotated[str, typer.Argument(help="The identity: a node id or a user name.")],
    directory: DirOption,
    role: Annotated[
        str, typer.Option("--role", help="What the identity may do: node, operator or reader.")
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Where NAME.key (mode 600), NAME.crt and ca.crt go.")
    ],
    days: Annotated[int, typer.Option("--days", help="How long it is valid.")] = DEFAULT_DAYS,
    san: Annotated[
        list[str] | None,
        typer.Option(
            "--san",
            help="A DNS name or IP address the node serves HTTPS on (repeat; node role only).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace NAME.key and NAME.crt in --out.")
    ] = False,
) -> None:
    """Issue a key and certificate for NAME with a role, signed by the CA in DIR, and record it
    in the CA's index. A node certificate serves and calls (serverAuth+clientAuth), an operator
    or reader certificate only calls (clientAuth)."""
    try:
        cert_role = CertRole(role)
    except ValueError:
        fail(f"--role {role!r}: use node, operator or reader")
    try:
        files = issue_certificate(
            directory, name, cert_role, out=out, days=days, sans=san or (), force=force
        )
    except CaError as exc:
        fail(exc.problems, EXIT_USAGE)
    issued = files.issued
    console.print(
        f"issued {issued.role.value} certificate {issued.name} serial"
        f" {serial_text(issued.serial)}, valid until {issued.not_after.isoformat()}",
        highlight=False,
    )
    for path in (files.key_path, files.cert_path, files.ca_path):
        console.print(f"  {path}", highlight=False)


@ca_app.command("revoke")
def ca_revoke(
    target: Annotated[
        str, typer.Argument(help="A name (revokes all its certificates) or a serial (hex).")
    ],
    directory: DirOption,
) -> None:
    """Revoke every unrevoked certificate of NAME, or the one with SERIAL, and sign a new
    crl.pem in DIR with the next CRL number. Unknown name or serial: exit 2."""
    try:
        revoked, crl_number = revoke(directory, target)
    except CaError as exc:
        fail(exc.problems, EXIT_USAGE)
    if not revoked:
        console.print(f"{target}: already revoked (CRL number {crl_number})", highlight=False)
        return
    for row in revoked:
        console.print(f"revoked {row.name} serial {serial_text(row.serial)}", highlight=False)
    console.print(
        f"{directory / 'crl.pem'}: CRL number {crl_number}; give it to every node", highlight=False
    )


@ca_app.command("list")
def ca_list(directory: DirOption, as_json: JsonOption = False) -> None:
    """Every certificate the CA in DIR issued: name, role, serial, expiry, expired?, revoked?"""
    try:
        ca = load_ca(directory)
        index = read_index(directory)
    except CaError as exc:
        fail(exc.problems, EXIT_USAGE)
    now = datetime.now(UTC)
    rows = [
        {
            **row.to_json(),
            "expired": row.expired(now),
            "revoked": row.revoked_at is not None,
        }
        for row in index.issued
    ]
    if as_json:
        print_json(
            {
                "dir": str(directory),
                "ca": ca.cert.subject.rfc4514_string(),
                "ca_not_after": ca.cert.not_valid_after_utc.isoformat(),
                "crl_number": index.crl_number,
                "issued": rows,
            }
        )
        return
    table = Table(title=f"{len(rows)} issued by {ca.cert.subject.rfc4514_string()}")
    for column in ("name", "role", "serial", "not_after", "expired", "revoked"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["name"],
            row["role"],
            row["serial"],
            row["not_after"],
            "yes" if row["expired"] else "no",
            "yes" if row["revoked"] else "no",
        )
    console.print(table)
