"""`shoal` imports only the command it runs: `--help` and `--version` import no command's module
(no aiohttp, zeroconf, torch, pydantic), `shoal status` imports node.cli.inspect alone; and the
deferred command table reads exactly as the command line did with every module imported."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from config import shoal_version
from node.cli import app
from node.cli.app import COMMANDS, eager_app
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("aiohttp", "zeroconf", "torch", "pydantic", "yaml", "asyncssh", "node.daemon")
WIDE = {"COLUMNS": "100"}


def _run_shoal(*argv: str) -> tuple[int, str, list[str]]:
    """`shoal argv...` in a fresh interpreter: exit status, stdout, and the modules it loaded."""
    script = (
        "import json, sys\n"
        f"sys.argv = ['shoal', *{list(argv)!r}]\n"
        "from node.cli import main\n"
        "try:\n"
        "    main()\n"
        "    code = 0\n"
        "except SystemExit as exc:\n"
        "    code = exc.code or 0\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "SHOAL_CONFIG": ""},
    )
    marker = result.stderr.rindex("\nMODULES ")
    modules: list[str] = json.loads(result.stderr[marker + len("\nMODULES ") :])
    return result.returncode, result.stdout, modules


def _heavy(modules: list[str], but: str = "") -> list[str]:
    heavy = [h for h in HEAVY if h != but]
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy))


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["version"], []])
def test_version_and_help_import_no_command(argv: list[str]) -> None:
    code, out, modules = _run_shoal(*argv)
    assert code == (2 if not argv else 0)  # no command: the help, exit 2 as before
    ours = sorted(m for m in modules if m.split(".")[0] in ("config", "node"))
    assert ours == ["config", "config.lazy", "config.version", "node", "node.cli", "node.cli.app"]
    # typer checks a command's options with pydantic (its own cost); the flags need none
    heavy = _heavy(modules) if argv != ["version"] else _heavy(modules, but="pydantic")
    assert heavy == []
    if argv and "help" not in argv[0]:
        assert out == f"shoal {shoal_version()}\n"


async def test_a_command_imports_its_own_module_only(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "light")) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"
        code, out, modules = await asyncio.to_thread(_run_shoal, "status", "--json", "--node", url)
    assert code == 0
    assert json.loads(out)["node_id"] == "light"
    commands = sorted(m for m in modules if m.startswith("node.cli."))
    assert commands == ["node.cli.app", "node.cli.common", "node.cli.inspect"]
    # one GET goes through net's blocking client: no aiohttp (whose import alone loads the CA
    # bundle twice, for its default TLS contexts) and no event loop
    unwanted = {"zeroconf", "torch", "node.daemon", "aiohttp", "asyncio", "yaml", "rich"}
    assert sorted(m for m in modules if m.split(".")[0] in unwanted or m in unwanted) == []


def test_version_flag_prints_the_version() -> None:
    runner = CliRunner()
    for argv in (["--version"], ["version"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 0
        assert result.output == f"shoal {shoal_version()}\n"


def test_the_table_lists_every_command_in_order_with_its_own_help() -> None:
    built = typer.main.get_group(eager_app())
    assert [entry.name for entry in COMMANDS] == list(built.commands)
    for entry in COMMANDS:
        command = built.commands[entry.name]
        first = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
        assert entry.help == first.strip(), entry.name
        assert entry.load().help == command.help


def _output(target: typer.Typer, argv: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(target, argv, env=WIDE)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        [],
        ["stauts"],
        ["wal"],
        ["wal", "--help"],
        ["wal", "stauts"],
        ["status", "--help"],
        ["status", "--bogus"],
        ["jobs", "run", "--help"],
        ["dev-cluster", "--help"],
    ],
    ids=lambda argv: " ".join(argv) or "no-args",
)
def test_deferred_commands_read_as_the_eager_ones(argv: list[str]) -> None:
    """Help, usage errors and typo suggestions are the same text either way."""
    assert _output(app, argv) == _output(eager_app(), argv)
