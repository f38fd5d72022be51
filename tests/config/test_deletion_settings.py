"""`sync_categories:` deletion policies and `tombstone_ttl_s`: defaults, a config file that
sets them, and errors that name the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import ConfigError, load_settings


def test_default_policies() -> None:
    settings = load_settings(env={}).settings
    policies = {c: settings.deletion_policy(c) for c in ("models", "training", "configs")}
    assert policies == {"models": "keep", "training": "keep", "configs": "propagate"}
    assert settings.deletion_policy("games") == "keep"
    assert settings.deletion_policy("rollouts") == "keep"
    assert settings.tombstone_ttl_s == 7 * 86400


def test_a_config_file_sets_policies_and_the_ttl(tmp_path: Path) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text(
        "tombstone_ttl_s: 3600\n"
        "sync_categories:\n"
        "  models:\n"
        "    deletions: propagate\n"
        "  configs:\n"
        "    deletions: keep\n"
    )
    settings = load_settings(config, env={}).settings
    assert settings.deletion_policy("models") == "propagate"
    assert settings.deletion_policy("configs") == "keep"
    assert settings.deletion_policy("training") == "keep"  # not named: its default
    assert settings.tombstone_ttl_s == 3600


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "sync_categories:\n  configs:\n    deletions: maybe\n",
            "sync_categories.configs.deletions",
        ),
        ("sync_categories:\n  games:\n    deletions: propagate\n", "records are never deleted"),
        ("sync_categories:\n  configs:\n    delete: keep\n", "sync_categories.configs.delete"),
        ("sync_categories:\n  photos:\n    deletions: keep\n", "sync_categories.photos"),
        ("tombstone_ttl_s: 0\n", "tombstone_ttl_s"),
    ],
)
def test_errors_name_the_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(config, env={})
    problems = info.value.problems
    assert any(p.startswith(f"{config}:") and expected in p for p in problems), problems
