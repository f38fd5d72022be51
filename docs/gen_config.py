"""Reference tables of docs/configuration.md, generated from the models so they never drift.

`python docs/gen_config.py` (or `python docs/gen_config.py PAGE.md`) rewrites the tables between
their markers; tests/config/test_docs.py fails when the page differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from config.settings import ENV_VARS
from config.timeouts import Timeouts

TIMEOUTS_BEGIN = "<!-- timeouts:begin -->"
TIMEOUTS_END = "<!-- timeouts:end -->"
ENV_BEGIN = "<!-- env:begin -->"
ENV_END = "<!-- env:end -->"


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


def _replace(text: str, begin: str, end: str, body: str) -> str:
    head, sep, rest = text.partition(begin)
    if not sep:
        raise ValueError(f"marker {begin} not found")
    _, sep, tail = rest.partition(end)
    if not sep:
        raise ValueError(f"marker {end} not found")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render_page(text: str) -> str:
    """`text` with every generated table replaced by its current content."""
    text = _replace(text, TIMEOUTS_BEGIN, TIMEOUTS_END, timeouts_table())
    return _replace(text, ENV_BEGIN, ENV_END, env_table())


def main(argv: list[str]) -> int:
    page = Path(__file__).resolve().with_name("configuration.md")
    path = Path(argv[1]) if len(argv) > 1 else page
    path.write_text(render_page(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
