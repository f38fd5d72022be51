from __future__ import annotations

from pathlib import Path

import pytest

from config import (
    ConfigError,
    Timeouts,
    describe_settings,
    load_or_create_node_id,
    load_settings,
)


def test_defaults(tmp_path: Path) -> None:
    loaded = load_settings(env={})
    settings = loaded.settings
    assert settings.port == 8770
    assert settings.bind == "127.0.0.1"
    assert settings.timeouts.sync_s == 300
    assert settings.circuit_threshold == 5
    assert settings.data_dir.is_absolute()
    assert settings.wal_path == settings.data_dir / "wal" / "wal.db"
    assert all(source == "default" for _, _, source in describe_settings(loaded))


def test_precedence_default_file_env_flag(tmp_path: Path) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text("port: 9000\nbind: 0.0.0.0\ntimeouts:\n  sync_s: 10\ncluster_name: lab\n")
    env = {"SHOAL_CONFIG": str(config), "SHOAL_P2P_PORT": "9100", "SHOAL_SYNC_TIMEOUT": "20"}
    loaded = load_settings(env=env, flags={"port": 9200, "node_id": None})
    settings = loaded.settings
    assert settings.port == 9200
    assert loaded.sources["port"] == "flag"
    assert settings.timeouts.sync_s == 20
    assert loaded.sources["timeouts.sync_s"] == "env:SHOAL_SYNC_TIMEOUT"
    assert settings.bind == "0.0.0.0"
    assert loaded.sources["bind"] == f"file:{config}:2"
    assert settings.cluster_name == "lab"
    assert settings.node_id is None


def test_every_documented_environment_variable(tmp_path: Path) -> None:
    env = {
        "SHOAL_CLUSTER_CONFIG": str(tmp_path / "hosts.yaml"),
        "SHOAL_DATA_DIR": str(tmp_path / "data"),
        "SHOAL_NODE_ID": "gpu-a",
        "SHOAL_P2P_PORT": "8771",
        "SHOAL_SYNC_TIMEOUT": "42",
        "SHOAL_WAL_DIR": str(tmp_path / "wal"),
        "SHOAL_CIRCUIT_THRESHOLD": "7",
    }
    settings = load_settings(env=env).settings
    assert settings.inventory == tmp_path / "hosts.yaml"
    assert settings.data_dir == tmp_path / "data"
    assert settings.node_id == "gpu-a"
    assert settings.port == 8771
    assert settings.timeouts.sync_s == 42
    assert settings.wal_path == tmp_path / "wal" / "wal.db"
    assert settings.circuit_threshold == 7


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env={"SHOAL_P2P_PORT": "abc"})
    assert info.value.problems == [
        "environment variable SHOAL_P2P_PORT: port: must be an integer 0-65535 (0 picks a free "
        "port), got 'abc'"
    ]


def test_bad_file_value_names_file_line_and_field(tmp_path: Path) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text("bind: 0.0.0.0\ntimeouts:\n  sync_s: -1\n  probe_intervl_s: 1\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config, env={})
    problems = info.value.problems
    assert f"{config}:3: timeouts.sync_s: input should be greater than 0, got -1" in problems
    assert any(
        p.startswith(f"{config}:4: timeouts.probe_intervl_s: unknown key; did you mean")
        for p in problems
    )


def test_bad_flag_names_the_command_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env={}, flags={"seeds": ["nohost"]})
    assert info.value.problems[0].startswith("command line: seeds: each seed must be HOST:PORT")


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.yaml", env={})


def test_timeouts_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="detection < collective_s < quorum_s < watchdog_s"):
        Timeouts(quorum_s=10, collective_s=20)
    with pytest.raises(ValueError, match="election_min_s"):
        Timeouts(election_min_s=5, election_max_s=1)


def test_node_id_generated_once_and_kept(tmp_path: Path) -> None:
    first = load_or_create_node_id(tmp_path / "d")
    assert load_or_create_node_id(tmp_path / "d") == first
    assert load_or_create_node_id(tmp_path / "other") != first
    assert load_or_create_node_id(tmp_path / "d", explicit="gpu-x") == "gpu-x"


def test_corrupt_node_id_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "node_id").write_text("bad id with spaces\n")
    with pytest.raises(ConfigError, match="invalid node id"):
        load_or_create_node_id(tmp_path)


def test_config_hash_ignores_node_specific_settings() -> None:
    a = load_settings(env={"SHOAL_NODE_ID": "a", "SHOAL_P2P_PORT": "1"}).settings
    b = load_settings(env={"SHOAL_NODE_ID": "b", "SHOAL_P2P_PORT": "2"}).settings
    c = load_settings(env={"SHOAL_SYNC_TIMEOUT": "5"}).settings
    assert a.config_hash() == b.config_hash() != c.config_hash()


def test_timeout_ordering_error_names_the_file_and_lines(tmp_path: Path) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text("bind: 127.0.0.1\ntimeouts:\n  collective_s: 500\n  quorum_s: 20\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config, env={})
    [problem] = info.value.problems
    assert problem.startswith(f"{config}:3, {config}:4: timeouts: ")
    assert "collective_s=500 is not below quorum_s=20" in problem
