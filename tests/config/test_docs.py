from __future__ import annotations

from pathlib import Path

from config.docs import render_readme

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_tables_are_generated_from_the_models() -> None:
    text = README.read_text(encoding="utf-8")
    assert render_readme(text) == text, "run: .venv/bin/python -m config.docs README.md"
    assert "`sync_s` | 300 |" in text
    assert "`SHOAL_SYNC_TIMEOUT` | `timeouts.sync_s` |" in text
