"""cluster_monitor's output: once or --watch, as JSON (NDJSON when watching), a live rich display
on a terminal, or plain text tables on a pipe; `q` (stdin in cbreak mode) or Ctrl-C quits.
rich (and the views drawn with it) is imported by the views that draw, so --json stays light.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import termios
import tty
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, TextIO

from health.monitor.model import ClusterStatus

__all__ = ["QuitKeys", "plain_width", "print_status", "run_until", "watch_statuses"]

QUIT_KEYS = frozenset(b"qQ")
DEFAULT_PLAIN_WIDTH = 120


def plain_width(environ: Mapping[str, str] = os.environ) -> int:
    """Columns of plain (non-terminal) output: $COLUMNS when it is a number, else 120."""
    columns = environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 40 else DEFAULT_PLAIN_WIDTH


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _drop_closed_stdout() -> None:
    """The reader of stdout went away (`| head`): point stdout at /dev/null so that later
    writes and the interpreter's final flush do not fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError):
        os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_status(
    status: ClusterStatus, out: TextIO, *, as_json: bool, probe_interval_s: float
) -> None:
    """One status on `out`: indented JSON, a coloured dashboard on a terminal, else plain text."""
    try:
        if as_json:
            out.write(json.dumps(status.to_dict(), indent=2) + "\n")
        elif _is_tty(out):
            from rich.console import Console

            from health.monitor.render import render_dashboard

            console = Console(file=out, highlight=False)
            console.print(
                render_dashboard(status, probe_interval_s=probe_interval_s, width=console.width)
            )
        else:
            from health.monitor.render import render_text

            out.write(render_text(status, probe_interval_s=probe_interval_s, width=plain_width()))
        out.flush()
    except BrokenPipeError:
        _drop_closed_stdout()


class QuitKeys:
    """Owns the terminal mode of `stream` while watching: cbreak on enter (so one key press is
    read without Enter), restored on exit; sets `stop` when q is pressed. No-op off a TTY or
    in a background job."""

    def __init__(self, stop: asyncio.Event, stream: TextIO) -> None:
        self._stop = stop
        self._stream = stream
        self._fd: int | None = None
        self._saved: list[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> QuitKeys:
        if not _is_tty(self._stream):
            return self
        fd = self._stream.fileno()
        if os.tcgetpgrp(fd) != os.getpgrp():  # in the background: touching the mode stops us
            return self
        self._saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._on_input)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading and restore the terminal mode. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(fd)
        if self._saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, self._saved)

    def _on_input(self) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            data = os.read(fd, 1024)
        except OSError:
            data = b""
        if not data and self._loop is not None:  # end of input: stop listening, keep watching
            self._loop.remove_reader(fd)
        if any(byte in QUIT_KEYS for byte in data):
            self._stop.set()


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM set `stop` instead of raising, until the block ends."""
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def run_until(stop: asyncio.Event, work: Coroutine[Any, Any, None]) -> None:
    """Run `work` until it ends or `stop` is set (then it is cancelled); its errors propagate."""
    worker = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({worker, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (worker, stopper):
            task.cancel()
        # Only the two children's CancelledError is collected here; our own cancellation
        # re-raises from this await.
        await asyncio.gather(worker, stopper, return_exceptions=True)
    if not worker.cancelled():
        error = worker.exception()
        if error is not None:
            raise error


def _emitter(
    out: TextIO, as_json: bool, probe_interval_s: float
) -> Callable[[ClusterStatus], None]:
    if as_json:

        def emit_json(status: ClusterStatus) -> None:
            out.write(json.dumps(status.to_dict(), separators=(",", ":")) + "\n")
            out.flush()

        return emit_json

    from health.monitor.render import render_text

    def emit_text(status: ClusterStatus) -> None:
        out.write(render_text(status, probe_interval_s=probe_interval_s, width=plain_width()))
        out.write("\n")
        out.flush()

    return emit_text


async def watch_statuses(
    statuses: AsyncGenerator[ClusterStatus, None],
    *,
    interval_s: float,
    probe_interval_s: float,
    as_json: bool = False,
    out: TextIO | None = None,
    keys: TextIO | None = None,
) -> None:
    """Show every status of `statuses` until q, Ctrl-C, SIGTERM, or a closed output pipe.

    On a terminal (and without --json) the dashboard is redrawn in place with rich Live;
    otherwise each status is written in full (NDJSON lines with `as_json`).
    """
    out = sys.stdout if out is None else out
    keys = sys.stdin if keys is None else keys
    stop = asyncio.Event()
    hint = f"every {interval_s:g} s; q or Ctrl-C quits"
    with _stop_on_signals(stop), QuitKeys(stop, keys):
        if as_json or not _is_tty(out):
            emit = _emitter(out, as_json, probe_interval_s)
            await run_until(stop, _feed(statuses, emit))
            return
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        from health.monitor.render import render_dashboard

        console = Console(file=out, highlight=False)
        with Live(
            Text("asking the cluster...", style="dim"),
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live:

            def draw(status: ClusterStatus) -> None:
                view = render_dashboard(
                    status, probe_interval_s=probe_interval_s, width=console.width, hint=hint
                )
                live.update(view, refresh=True)

            await run_until(stop, _feed(statuses, draw))


async def _feed(
    statuses: AsyncGenerator[ClusterStatus, None], emit: Callable[[ClusterStatus], None]
) -> None:
    try:
        async with contextlib.aclosing(statuses):
            async for status in statuses:
                emit(status)
    except BrokenPipeError:
        _drop_closed_stdout()
