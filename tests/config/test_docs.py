from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

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
