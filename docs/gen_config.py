"""Reference tables of docs/configuration.md and docs/fault-tolerance.md, generated from the
models so they never drift.

`python docs/gen_config.py` (or `python docs/gen_config.py PAGE.md ...`) rewrites the tables
between their markers (a page holds the markers of the tables it shows); tests/config/test_docs.py
fails when a page differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from config.sections import TrainingWatchSettings
from config.settings import ENV_VARS
from config.timeouts import Timeouts

TIMEOUTS_BEGIN = "<!-- timeouts:begin -->"
TIMEOUTS_END = "<!-- timeouts:end -->"
ENV_BEGIN = "<!-- env:begin -->"
ENV_END = "<!-- env:end -->"
TRAINING_BEGIN = "<!-- training-settings:begin -->"
TRAINING_END = "<!-- training-settings:end -->"
PAGES = ("configuration.md", "fault-tolerance.md")


def timeouts_table() -> str:
    """The timeout table as Markdown: name, default seconds, meaning."""
    rows = ["| timeout | default (s) | what it bounds |", "|---|---|---|"]
    defaults = Timeouts()
    for name, field in Timeouts.model_fields.items():
        rows.append(f"| `{name}` | {getattr(defaults, name):g} | {field.description} |")
    return "\n".join(rows)


def env_table() -> str:
    """The environment variables as Markdown."""
    rows = ["| variable | setting |", "|---|---|", "| `SHOAL_CONFIG` | the config file |"]
    rows += [f"| `{var}` | `{name}` |" for var, name in ENV_VARS.items()]
    return "\n".join(rows)


def training_table() -> str:
    """The settings of the training loop's fault handling as Markdown: name, default, meaning."""
    rows = ["| setting | default | what it does |", "|---|---|---|"]
    for name, field in TrainingWatchSettings.model_fields.items():
        default = field.default
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        rows.append(f"| `{name}` | `{shown}` | {field.description} |")
    return "\n".join(rows)


def _replace(text: str, begin: str, end: str, body: str) -> str:
    head, sep, rest = text.partition(begin)
    if not sep:
        raise ValueError(f"marker {begin} not found")
    _, sep, tail = rest.partition(end)
    if not sep:
        raise ValueError(f"marker {end} not found")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render_page(text: str) -> str:
    """`text` with every generated table it marks replaced by its current content."""
    tables = (
        (TIMEOUTS_BEGIN, TIMEOUTS_END, timeouts_table),
        (ENV_BEGIN, ENV_END, env_table),
        (TRAINING_BEGIN, TRAINING_END, training_table),
    )
    for begin, end, table in tables:
        if begin in text:
            text = _replace(text, begin, end, table())
    return text


def main(argv: list[str]) -> int:
    docs = Path(__file__).resolve().parent
    for path in [Path(name) for name in argv[1:]] or [docs / name for name in PAGES]:
        path.write_text(render_page(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
