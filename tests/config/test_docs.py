from __future__ import annotations

from pathlib import Path

from config.docs import render_page

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_tables_are_generated_from_the_models() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert render_page(text) == text, "run: .venv/bin/python -m config.docs"
    assert "`sync_s` | 300 |" in text
    assert "`SHOAL_SYNC_TIMEOUT` | `timeouts.sync_s` |" in text
