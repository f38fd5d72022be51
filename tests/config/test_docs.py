from __future__ import annotations

from pathlib import Path

from config.docs import render_page
from config.sections import TrainingWatchSettings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_tables_are_generated_from_the_models() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert render_page(text) == text, "run: .venv/bin/python -m config.docs"
    assert "`sync_s` | 300 |" in text
    assert "`SHOAL_SYNC_TIMEOUT` | `timeouts.sync_s` |" in text


def test_the_fault_tolerance_settings_are_generated_from_the_model() -> None:
    page = (PAGE.parent / "fault-tolerance.md").read_text(encoding="utf-8")
    assert render_page(page) == page, "run: .venv/bin/python -m config.docs"
    config_page = PAGE.read_text(encoding="utf-8")
    for name in TrainingWatchSettings.model_fields:
        assert f"| `{name}` |" in page, f"docs/fault-tolerance.md lacks {name}"
        assert f"\n{name}: " in config_page, f"docs/configuration.md's example lacks {name}"
    assert "| `training_hang_s` | `60` |" in page
