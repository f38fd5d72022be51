"""The cluster_monitor dashboard as a rich renderable: a pure function of a ClusterStatus.

One row per node, then a footer with totals, the coordinator and term, drift and recent failures.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from config import Timeouts
from health.gpu import GpuInfo
from health.monitor.model import AutostopInfo, ClusterStatus, FailureEvent, NodeRow

__all__ = [
    "autostop_text",
    "breakers_text",
    "format_duration",
    "gpu_text",
    "render_dashboard",
    "render_text",
    "seen_style",
    "wal_text",
]

AMBER = "dark_orange"
RED = "bold red"
GREEN = "green"
DIM = "dim"
PROBE_INTERVAL_S = Timeouts().probe_interval_s
NARROW_WIDTH = 110
"""Below this many columns the address, role, term, jobs, autostop and version columns are
left out (autostop also while no node has auto-stop on; drain is shown only while a node
drains, training only while a node's ranks report)."""

_COLUMNS = ("node", "address", "role", "state", "drain", "seen", "term", "health", "gpus",
            "training", "jobs", "autostop", "wal", "breakers", "version")  # fmt: skip
_WIDE_ONLY = frozenset({"address", "role", "term", "version", "jobs", "autostop"})
_WRAPPING = frozenset({"health", "gpus", "autostop", "breakers", "version"})
_GAP = 2
"""Columns between two cells: the cell's right padding and the box's blank divider."""
_STATE_STYLE = {"alive": GREEN, "suspect": AMBER, "dead": RED, "left": DIM, "unknown": AMBER}
_HEALTH_STYLE = {"healthy": GREEN, "degraded": AMBER, "unhealthy": RED}


def format_duration(seconds: float) -> str:
    """`0.3 s`, `42 s`, `12 min`, `5.0 h`."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


_ACTED = {"stop": "stopped", "release": "released"}
_ACTING = {"stop": "stopping", "release": "releasing"}


def autostop_text(info: AutostopInfo | None) -> str:
    """One short cell: `-` (not reported), `off`, `starting` (no check made yet),
    `idle 42 s/10 min`, `busy: job running +1`, `stopping`, `stopped`; ` (dry run)` when it
    only audits."""
    if info is None:
        return "-"
    if not info.enabled:
        return "off"
    action = info.action or "stop"
    if info.state == "starting":
        text = "starting"
    elif info.state == "acted":
        text = _ACTED.get(action, action)
    elif info.state == "acting":
        text = _ACTING.get(action, action)
    elif info.state == "busy":
        more = f" +{len(info.busy_reasons) - 1}" if len(info.busy_reasons) > 1 else ""
        text = f"busy: {info.busy_reasons[0] if info.busy_reasons else '?'}{more}"
    else:
        idle = format_duration(info.idle_for_s or 0.0)
        window = "?" if info.window_s is None else format_duration(info.window_s)
        text = f"idle {idle}/{window}"
    return f"{text} (dry run)" if info.dry_run else text


def gpu_text(gpus: Sequence[GpuInfo]) -> str:
    """`4x 87% 61/80G 71C` (count, mean util, memory used/total in GiB, hottest) plus faults."""
    if not gpus:
        return "-"
    parts = [f"{len(gpus)}x"]
    utils = [gpu.util_pct for gpu in gpus if gpu.util_pct is not None]
    if utils:
        parts.append(f"{sum(utils) / len(utils):.0f}%")
    used = [gpu.memory_used_mb for gpu in gpus if gpu.memory_used_mb is not None]
    total = [gpu.memory_total_mb for gpu in gpus if gpu.memory_total_mb is not None]
    if total:
        parts.append(f"{sum(used) / 1024:.0f}/{sum(total) / 1024:.0f}G")
    temps = [gpu.temperature_c for gpu in gpus if gpu.temperature_c is not None]
    if temps:
        parts.append(f"{max(temps):.0f}C")
    faults = sorted({fault for gpu in gpus for fault in gpu.faults})
    if faults:
        parts.append("!" + ",".join(faults).upper())
    return " ".join(parts)


def wal_text(row: NodeRow) -> str:
    """`12 (34 s)`: pending operations and the age of the oldest; `0` when none."""
    if row.wal_pending is None:
        return "-"
    if row.wal_pending == 0 or row.wal_oldest_pending_age_s is None:
        return str(row.wal_pending)
    return f"{row.wal_pending} ({format_duration(row.wal_oldest_pending_age_s)})"


def breakers_text(row: NodeRow) -> str:
    """`2 open: gpu-b/http, gpu-c/rsync`, or `-`."""
    if not row.breakers_open:
        return "-"
    return f"{len(row.breakers_open)} open: {', '.join(row.breakers_open)}"


def _node_cell(row: NodeRow, narrow: bool) -> Text:
    text = Text(row.node_id, style="bold" if row.is_coordinator else "")
    if row.is_coordinator:
        text.append(" *", style="bold cyan")
    if narrow and (row.version_drift or row.config_drift):
        text.append(" !", style=AMBER)
    return text


def seen_style(row: NodeRow, probe_interval_s: float) -> str:
    """Style of the seconds since last heard: red when suspect or dead, amber past two probe
    intervals, else none."""
    if row.state in ("suspect", "dead"):
        return RED
    if row.last_seen_s is not None and row.last_seen_s > 2 * probe_interval_s:
        return "" if row.state == "left" else AMBER
    return ""


def _seen_cell(row: NodeRow, probe_interval_s: float) -> Text:
    if row.last_seen_s is None:
        return Text("-", style=DIM)
    return Text(format_duration(row.last_seen_s), style=seen_style(row, probe_interval_s))


def _health_cell(row: NodeRow) -> Text:
    if row.error is not None:
        return Text(row.error, style=RED)
    health = row.health or "?"
    text = health
    if row.health_problems and health != "healthy":
        text = f"{health}: {row.health_problems[0]}"  # e.g. a failing loop and its last error
    return Text(text, style=_HEALTH_STYLE.get(health, AMBER))


def _gpu_cell(row: NodeRow) -> Text:
    faulty = any(gpu.faults for gpu in row.gpus)
    return Text(gpu_text(row.gpus), style=RED if faulty else "")


def _wal_cell(row: NodeRow) -> Text:
    return Text(wal_text(row), style=AMBER if row.wal_pending else "")


def _version_cell(row: NodeRow) -> Text:
    text = Text(row.version or "-", style=AMBER if row.version_drift else "")
    if row.version_drift:
        text.append(" drift", style=AMBER)
    if row.config_drift:
        text.append(f" cfg {row.config_hash} drift", style=AMBER)
    return text


def _fit_widths(natural: Sequence[int], minimum: Sequence[int], budget: int) -> list[int] | None:
    """Column widths within `budget`: natural widths when they fit, else minimums plus the room
    left, given first to the columns that lack least; None when even minimums do not fit."""
    if sum(natural) <= budget:
        return list(natural)
    if sum(minimum) > budget:
        return None
    room = budget - sum(minimum)
    widths = list(minimum)
    by_need = sorted(range(len(widths)), key=lambda i: natural[i] - minimum[i])
    for index in by_need:
        grant = min(room, natural[index] - minimum[index])
        widths[index] += grant
        room -= grant
    return widths


def _longest_word(text: Text) -> int:
    return max((len(word) for word in text.plain.split()), default=1)


def _table(status: ClusterStatus, probe_interval_s: float, width: int) -> Table:
    narrow = width < NARROW_WIDTH
    shown = {
        "autostop": any(row.autostop is not None and row.autostop.enabled for row in status.nodes),
        "drain": any(row.drain is not None for row in status.nodes),
        "training": any(row.training is not None for row in status.nodes),
    }
    columns = [c for c in _COLUMNS if not (narrow and c in _WIDE_ONLY) and shown.get(c, True)]
    rows = [_cells(row, probe_interval_s, narrow) for row in status.nodes]
    natural = [max([len(name)] + [rows_[name].cell_len for rows_ in rows]) for name in columns]
    minimum = [
        max([len(name)] + [_longest_word(cells[name]) for cells in rows])
        if name in _WRAPPING
        else nat
        for name, nat in zip(columns, natural, strict=True)
    ]
    widths = _fit_widths(natural, minimum, width - _GAP * (len(columns) - 1))
    table = Table(
        box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False,
        header_style="bold",
    )  # fmt: skip
    for index, name in enumerate(columns):
        wraps = name in _WRAPPING
        table.add_column(
            name,
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
            width=None if widths is None else widths[index],
        )
    for cells in rows:
        table.add_row(*(cells[name] for name in columns))
    return table


def _cells(row: NodeRow, probe_interval_s: float, narrow: bool) -> dict[str, Text]:
    return {
        "node": _node_cell(row, narrow),
        "address": Text(f"{row.address}:{row.port}"),
        "role": Text(row.role or "-"),
        "state": Text(
            f"{row.state} (refused)" if row.refused else row.state,
            style=_STATE_STYLE.get(row.state, ""),
        ),
        "drain": Text(
            "-" if row.drain is None else row.drain.text(), style=AMBER if row.drain else ""
        ),
        "seen": _seen_cell(row, probe_interval_s),
        "term": Text("-" if row.term is None else str(row.term)),
        "health": _health_cell(row),
        "gpus": _gpu_cell(row),
        "training": Text("-" if row.training is None else row.training.text()),
        "jobs": Text("-" if row.jobs_running is None else str(row.jobs_running)),
        "autostop": Text(autostop_text(row.autostop), style=_autostop_style(row.autostop)),
        "wal": _wal_cell(row),
        "breakers": Text(breakers_text(row), style=AMBER if row.breakers_open else ""),
        "version": _version_cell(row),
    }


def _autostop_style(info: AutostopInfo | None) -> str:
    if info is None or not info.enabled:
        return DIM
    return AMBER if info.state in ("acting", "acted") else ""


def _title(status: ClusterStatus, hint: str | None) -> Text:
    summary = status.summary
    when = time.strftime("%H:%M:%S", time.localtime(status.time))
    text = Text(f"shoal cluster {summary.cluster or '?'}  {when}  ", style="bold")
    if status.ok:
        text.append("OK", style=GREEN)
    else:
        failing = sum(1 for row in status.nodes if row.failing)
        text.append(f"{failing} of {summary.nodes_total} nodes need attention", style=RED)
    if hint:
        text.append(f"  ({hint})", style=DIM)
    return text


def _totals(status: ClusterStatus) -> list[Text]:
    s = status.summary
    down = [
        f"{count} {what}"
        for count, what in (
            (s.nodes_suspect, "suspect"),
            (s.nodes_dead, "dead"),
            (s.nodes_left, "left"),
            (s.nodes_unknown, "unknown"),
            (s.nodes_unreachable, "unreachable"),
        )
        if count
    ]
    nodes = Text(f"nodes {s.nodes_alive}/{s.nodes_total} alive")
    if down:
        nodes.append(f" ({', '.join(down)})", style=RED if s.nodes_dead or s.nodes_suspect else "")
    gpus = Text(f"GPUs {s.gpus_total}")
    if s.gpus_faulty:
        gpus.append(f" ({s.gpus_faulty} faulty)", style=RED)
    pending = Text(f"pending ops {s.wal_pending_total}", style=AMBER if s.wal_pending_total else "")
    return [nodes, gpus, pending, Text(f"breakers open {s.breakers_open_total}")]


def _cluster_parts(status: ClusterStatus) -> list[Text]:
    s = status.summary
    if status.coordinator is None:
        coordinator = Text("coordinator: none")
    else:
        coordinator = Text(f"coordinator {status.coordinator} (*)")
    if status.term is not None:
        coordinator.append(f", term {status.term}")
    parts = [
        coordinator,
        Text(f"version {s.version_majority or '-'}"),
        Text(f"config {s.config_hash_majority or '-'}"),
    ]
    if s.drifted:
        parts.append(Text(f"drift (!): {', '.join(s.drifted)}", style=AMBER))
    if len(s.releases) > 1:
        mixed = ", ".join(f"{release} x{len(nodes)}" for release, nodes in s.releases)
        parts.append(Text(f"releases {mixed}"))
    if s.release_warning is not None:
        parts.append(Text(f"(!) {s.release_warning}", style=RED))
    return parts


def _joined(parts: Sequence[Text], width: int, separator: str = " | ") -> Text:
    """`parts` joined by `separator` on one line, breaking between parts (not inside one) when
    the line would pass `width`."""
    text = Text()
    used = 0
    for index, part in enumerate(parts):
        if index and used + len(separator) + part.cell_len > width:
            text.append("\n")
            used = 0
        elif index:
            text.append(separator)
            used += len(separator)
        text.append_text(part)
        used += part.cell_len
    return text


def _failure_text(event: FailureEvent, now: float) -> str:
    detail = f" ({event.detail})" if event.detail else ""
    return f"{event.node_id} {event.kind} {format_duration(max(0.0, now - event.at))} ago{detail}"


def _failures(status: ClusterStatus) -> Text:
    if not status.recent_failures:
        return Text("recent failures: none", style=DIM)
    text = Text("recent failures:", style=RED)
    for event in status.recent_failures:
        text.append(f"\n  {_failure_text(event, status.time)}")
    return text


def render_dashboard(
    status: ClusterStatus,
    *,
    probe_interval_s: float = PROBE_INTERVAL_S,
    width: int = 120,
    hint: str | None = None,
) -> RenderableType:
    """The dashboard of `status` laid out for `width` columns; `hint` is shown after the title."""
    return Group(
        _title(status, hint),
        _table(status, probe_interval_s, width),
        _joined(_totals(status), width),
        _joined(_cluster_parts(status), width),
        _failures(status),
    )


def render_text(
    status: ClusterStatus, *, probe_interval_s: float = PROBE_INTERVAL_S, width: int = 120
) -> str:
    """The dashboard as plain text (no colour, no cursor codes), for pipes and cron."""
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, color_system=None, force_terminal=False, highlight=False
    )
    console.print(render_dashboard(status, probe_interval_s=probe_interval_s, width=width))
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
