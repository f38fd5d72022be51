from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from config.sections import TrainingWatchSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "configuration.md"


def _gen_config() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config", DOCS / "gen_config.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_tables_are_generated_from_the_models() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert _gen_config().render_page(text) == text, "run: .venv/bin/python docs/gen_config.py"
    assert "`sync_s` | 300 |" in text
    assert "`SHOAL_SYNC_TIMEOUT` | `timeouts.sync_s` |" in text


def test_the_fault_tolerance_settings_are_generated_from_the_model() -> None:
    page = (PAGE.parent / "fault-tolerance.md").read_text(encoding="utf-8")
    assert _gen_config().render_page(page) == page, "run: .venv/bin/python docs/gen_config.py"
    config_page = PAGE.read_text(encoding="utf-8")
    for name in TrainingWatchSettings.model_fields:
        assert f"| `{name}` |" in page, f"docs/fault-tolerance.md lacks {name}"
        assert f"\n{name}: " in config_page, f"docs/configuration.md's example lacks {name}"
    assert "| `training_hang_s` | `60` |" in page
