"""A warm spare training process: Python with torch and shoal's training modules already
imported, waiting for the node's launcher to hand it a worker's command, which it then runs as
`__main__` in this process. A restarted worker then costs its script's own start, not the
interpreter's and torch's (seconds on a busy host). Started by node.training.spares as
`python -c "import shoal._spare as s; s.main()"`.

Protocol: the spare is started with the worker's command in SHOAL_SPARE_COMMAND (a JSON list);
it writes `unsupported: WHY` on stdout and exits when it cannot run that command in place, else
`ready` once its imports are done; the launcher then writes one
JSON line on stdin, {"argv", "env", "cwd", "log"}; the spare appends its stdout and stderr to
`log`, takes `env` and `cwd`, and runs `argv` ([python, -u?, -B?, script, args...] or
[python, ..., -m, module, args...]), as `python argv...` would. End of input (the launcher is
gone) ends it.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ENV_COMMAND", "PRELOAD", "Command", "main", "parse_command"]

ENV_COMMAND = "SHOAL_SPARE_COMMAND"

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "shoal.session",
    "shoal.checkpoint",
)
"""What a spare imports before it says `ready` (SHOAL_SPARE_PRELOAD, comma-separated, replaces
it); a module that is not installed is skipped. torch._dynamo is what a torch optimizer imports
when the first one is made (seconds)."""
FLAGS = frozenset({"-u", "-B"})
"""The interpreter options a spare can take on after it started."""


@dataclass(frozen=True, slots=True)
class Command:
    """A Python command a spare can run: its script path or module, its arguments, and the
    options -u (unbuffered) and -B (no bytecode files)."""

    script: str | None
    module: str | None
    args: tuple[str, ...]
    unbuffered: bool = False
    no_bytecode: bool = False


def parse_command(argv: Sequence[str]) -> Command | None:
    """`argv` as a Command when it runs a Python script or module with only the options a spare
    can take on (FLAGS); None otherwise (another program, `-c`, `-I`, ...)."""
    if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
        return None
    flags: set[str] = set()
    index = 1
    while index < len(argv) and argv[index] in FLAGS:
        flags.add(argv[index])
        index += 1
    rest = list(argv[index:])
    options = {"unbuffered": "-u" in flags, "no_bytecode": "-B" in flags}
    if len(rest) >= 2 and rest[0] == "-m":
        return Command(None, rest[1], tuple(rest[2:]), **options)
    if rest and not rest[0].startswith("-"):
        return Command(rest[0], None, tuple(rest[1:]), **options)
    return None


def _preload(env: Mapping[str, str]) -> None:
    names = env.get("SHOAL_SPARE_PRELOAD")
    modules = PRELOAD if names is None else tuple(n for n in names.split(",") if n)
    for name in modules:
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
                importlib.import_module(name)
        except ImportError:
            continue


def _take_over(log: str, env: Mapping[str, str], cwd: str) -> None:
    """Become the worker's process: its output, its environment, its directory."""
    sys.stdout.flush()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)


def run(command: Command) -> None:
    """Run `command` as __main__, as the interpreter would have."""
    if command.unbuffered:
        sys.stdout.reconfigure(write_through=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(write_through=True)  # type: ignore[union-attr]
    sys.dont_write_bytecode = command.no_bytecode
    if command.module is not None:
        sys.argv = [command.module, *command.args]
        sys.path[0] = os.getcwd()
        runpy.run_module(command.module, run_name="__main__", alter_sys=True)
        return
    assert command.script is not None
    script = os.path.abspath(command.script)
    sys.argv = [command.script, *command.args]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    """The spare's life: check the command, preload, say ready, wait for the order, run it."""
    try:
        planned = parse_command(json.loads(os.environ.get(ENV_COMMAND, "")))
    except (ValueError, TypeError):
        planned = None
    if planned is None:
        print(f"unsupported: {ENV_COMMAND} is not a python script or -m command", flush=True)
        return
    _preload(os.environ)
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return
    order = json.loads(line)
    command = parse_command(order["argv"])
    if command is None:
        raise SystemExit(f"shoal spare: cannot run {order['argv']!r} in place")
    _take_over(order["log"], order["env"], order["cwd"])
    run(command)
