from __future__ import annotations

from pathlib import Path

import pytest

from config import InventoryError, Role, eligible_hosts, load_inventory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "examples" / "hosts.yaml"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    return info.value.problems


def test_example_inventory_loads() -> None:
    inventory = load_inventory(EXAMPLE)
    assert inventory.cluster.name == "lab"
    assert inventory.voters == ("gpu-a", "gpu-b", "gpu-c")
    assert inventory.hosts["gpu-b"].address == "100.64.0.11"
    assert inventory.hosts["gpu-a"].storage_paths["models"] == "/data/models"
    assert inventory.source == EXAMPLE


def test_voters_default_to_every_host(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  b: {ssh_host: 10.0.0.2}\n  a: {ssh_host: 10.0.0.1}\n")
    assert load_inventory(path).voters == ("a", "b")


def test_eligible_hosts_filters_role_status_vram_labels() -> None:
    inventory = load_inventory(EXAMPLE)
    assert sorted(eligible_hosts(inventory, role=Role.TRAINING)) == ["gpu-a", "gpu-b"]
    assert sorted(eligible_hosts(inventory, role="inference")) == ["gpu-b"]  # gpu-d: maintenance
    assert sorted(eligible_hosts(inventory, min_gpu_vram_gb=40)) == ["gpu-a", "gpu-b"]
    assert sorted(eligible_hosts(inventory, labels={"board": "hex8"})) == ["gpu-a", "gpu-b"]


def test_bad_port_names_file_line_host_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  gpu-a:\n    ssh_host: h\n    ssh_port: abc\n")
    assert _problems(path) == [
        f"{path}:4: hosts.gpu-a.ssh_port: must be an integer 1-65535, got 'abc'"
    ]


def test_port_out_of_range(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  gpu-a: {ssh_host: h, p2p_port: 70000}\n")
    assert "hosts.gpu-a.p2p_port: must be an integer 1-65535, got 70000" in _problems(path)[0]


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  gpu-a:\n    ssh_host: h\n    gpu_vram: 80\n")
    assert _problems(path) == [
        f"{path}:4: hosts.gpu-a.gpu_vram: unknown key; did you mean 'gpu_vram_gb'?"
    ]


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  a: {ssh_host: h}\nclustr: {name: x}\n")
    assert _problems(path) == [f"{path}:3: clustr: unknown key; did you mean 'cluster'?"]


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  a: [1\n")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:3:1: YAML syntax error")


def test_voter_that_is_not_a_host(tmp_path: Path) -> None:
    path = _write(tmp_path, "cluster: {voters: [a, zz]}\nhosts:\n  a: {ssh_host: h}\n")
    assert _problems(path) == [
        f"{path}:1: cluster.voters[1]: 'zz' is not a host in hosts (hosts: a)"
    ]


def test_duplicate_address_and_port(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  a: {ssh_host: h}\n  b: {tailscale_ip: h}\n")
    assert _problems(path) == [f"{path}:3: hosts.b: address h:8770 is also used by hosts.a"]


def test_missing_address(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  a: {ssh_user: u}\n")
    assert "hosts.a: needs ssh_host or tailscale_ip" in _problems(path)[0]


def test_bad_enum_and_node_id(tmp_path: Path) -> None:
    path = _write(tmp_path, "hosts:\n  a: {ssh_host: h, role: trainer}\n  '-x': {ssh_host: i}\n")
    problems = _problems(path)
    assert any("hosts.a.role: must be one of" in p and "'trainer'" in p for p in problems)
    assert any("hosts.-x" in p and "must be 1-63 characters" in p for p in problems)


def test_unreadable_and_missing_file(tmp_path: Path) -> None:
    assert _problems(tmp_path / "nope.yaml") == [f"{tmp_path / 'nope.yaml'}: inventory not found"]
    directory = tmp_path / "dir.yaml"
    directory.mkdir()
    assert "cannot read inventory" in _problems(directory)[0]


def test_not_a_mapping_and_empty(tmp_path: Path) -> None:
    assert "must be a YAML mapping" in _problems(_write(tmp_path, "- a\n- b\n"))[0]
    assert "lists no hosts" in _problems(_write(tmp_path, "cluster: {name: x}\n"))[0]


def test_secrets_are_never_printed(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "hosts:\n  a: {ssh_host: h, tunnel_token_id: abc, tunnel_token_secret: s3cr3t}\n",
    )
    inventory = load_inventory(path)
    assert "s3cr3t" not in repr(inventory)
    assert "s3cr3t" not in inventory.model_dump_json()


def test_every_error_is_reported_in_one_pass(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "cluster: {name: t, voters: [a, nope]}\n"
        "hosts:\n"
        "  a: {ssh_host: 1.2.3.4, p2p_port: 99999}\n"
        "  b: {ssh_host: 1.2.3.4, p2p_port: 8770, rol: training}\n"
        "  d: {ssh_host: 1.2.3.5, p2p_port: 8770}\n"
        "  e: {ssh_host: 1.2.3.5, p2p_port: 8770}\n",
    )
    problems = _problems(path)
    assert len(problems) == 4, problems
    assert any("hosts.a.p2p_port" in p for p in problems)
    assert any("hosts.b.rol: unknown key" in p for p in problems)
    assert any("cluster.voters[1]: 'nope' is not a host" in p for p in problems)
    assert any(
        p.endswith("hosts.e: address 1.2.3.5:8770 is also used by hosts.d") for p in problems
    )
