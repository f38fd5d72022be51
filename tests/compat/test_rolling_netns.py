"""A rolling upgrade from the previous release to this one on five netns hosts with real sshds,
under load: the previous tree's own `shoal deploy` installs it everywhere, then while a client
ingests games at a steady rate to the nodes in turn, samples every node's /v1/status and runs a
gang job over all five nodes, this tree's `shoal deploy --rolling --all` (run as a user runs it)
upgrades them one at a time. Checked: the roll exits 0 with every host upgraded and settled;
every game a node acknowledged is on every node afterwards; no term had two coordinators; at
every sample a majority of the voters answered; the gang job, whose members kept running
through their daemons' restarts, ends with exactly its members' exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import ClusterProcess, Host, NetnsClusterFactory
from tests.cluster.sshd import make_client_key, requires_sshd, start_sshd
from tests.cluster.waiting import wait_until
from tests.compat.previous import ROOT, OldTree, previous_tree

CLIENT = Path(__file__).with_name("rolling_client.py")
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
HOSTS = 5
EXIT_CODE = 7
RATE_HZ = 10.0
DEPLOY_S = 300.0
"""Bound on the first deploy: five venvs installed from the dependency wheels at once."""
ROLL_S = 400.0
READY_S = 180.0
RESULT_S = 300.0
SECRET = "rolling-test-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def old_tree() -> Iterator[OldTree]:
    with previous_tree() as tree:
        yield tree


def coordinators_by_term(samples: Sequence[Mapping[str, Any]]) -> dict[int, set[str]]:
    """Every coordinator any node named for each term, over every sample."""
    terms: dict[int, set[str]] = {}
    for sample in samples:
        for answer in sample["nodes"].values():
            if answer is not None and answer[0] is not None and answer[1] is not None:
                terms.setdefault(int(answer[0]), set()).add(str(answer[1]))
    return terms


def fewest_answering(samples: Sequence[Mapping[str, Any]], voters: Sequence[str]) -> int:
    """The fewest voters that answered their /v1/status in one sample."""
    return min(sum(sample["nodes"].get(v) is not None for v in voters) for sample in samples)


def releases_seen(samples: Sequence[Mapping[str, Any]], node: str) -> list[str]:
    """The releases `node` announced, in the order first seen."""
    seen: list[str] = []
    for sample in samples:
        answer = sample["nodes"].get(node)
        if answer is not None and answer[2] is not None and answer[2] not in seen:
            seen.append(answer[2])
    return seen


def test_summaries_of_samples() -> None:
    samples: list[dict[str, Any]] = [
        {"nodes": {"a": [1, "a", "r0"], "b": [1, "a", "r0"], "c": None}},
        {"nodes": {"a": None, "b": [2, None, "r0"], "c": [2, "c", "r1"]}},
        {"nodes": {"a": [2, "c", "r1"], "b": [2, "b", "r1"], "c": [2, "c", "r1"]}},
    ]
    assert coordinators_by_term(samples) == {1: {"a"}, 2: {"b", "c"}}
    assert fewest_answering(samples, ["a", "b", "c"]) == 2
    assert releases_seen(samples, "a") == ["r0", "r1"]


def _run(
    host: Host, argv: Sequence[str], *, cwd: Path, pythonpath: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """`argv` on `host` from `cwd` with PYTHONPATH `pythonpath` (`python -m` puts the working
    directory first on sys.path: each tree runs its own code)."""
    return subprocess.run(
        host.command(argv),
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _deploy_argv(inventory: Path, known: Path, secret: Path, cache: Path) -> list[str]:
    return [
        sys.executable, "-m", "node.cli", "deploy", "--all", "--json", "--offline",
        "--inventory", str(inventory), "--known-hosts", str(known), "--secret-file", str(secret),
        "--python", BASE_PYTHON, "--cache-dir", str(cache), "--health-timeout", "120",
    ]  # fmt: skip


def _wait_file(path: Path, client: ClusterProcess, timeout_s: float) -> dict[str, Any]:
    """The JSON document the client writes at `path`; fails at once when the client died."""

    def written() -> dict[str, Any] | None:
        if path.exists():
            document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return document
        assert client.running(), f"the client exited {client.returncode}:\n{client.log_tail()}"
        return None

    found = wait_until(
        written, timeout_s=timeout_s, interval_s=0.2, message=f"the client wrote {path.name}"
    )
    assert found is not None
    return found


@pytest.mark.netns
@requires_sshd()
@pytest.mark.timeout(1200)
def test_rolling_upgrade_from_previous_release_under_load(
    netns_cluster: NetnsClusterFactory, old_tree: OldTree, tmp_path: Path
) -> None:
    cluster = netns_cluster(HOSTS + 1)
    operator, *targets = cluster.hosts
    key = make_client_key(tmp_path / "client")
    servers = [start_sshd(tmp_path / f"sshd-{h.name}", [key.public_line], host=h) for h in targets]
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(s.known_hosts_line() for s in servers) + "\n")
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    inventory = tmp_path / "inventory.yaml"
    hosts = {
        h.name: {
            "ssh_host": h.address,
            "internal_ip": h.address,
            "ssh_user": "root",
            "ssh_key": str(key.path),
            "path": str(tmp_path / "targets" / h.name),
            "p2p_port": h.port,
        }
        for h in targets
    }
    inventory.write_text(yaml.safe_dump({"cluster": {"name": "rolltest"}, "hosts": hosts}))
    names = [h.name for h in targets]
    argv = _deploy_argv(inventory, known, secret, tmp_path / "cache")

    # The previous release, deployed by its own `shoal deploy` (its wheel built from its tree).
    first = _run(
        operator, argv, cwd=old_tree.root, pythonpath=old_tree.pythonpath, timeout_s=DEPLOY_S
    )
    assert first.returncode == 0, f"{first.stdout}\n{first.stderr}"
    installed = json.loads(first.stdout)["results"]
    assert {h: r["status"] for h, r in installed.items()} == dict.fromkeys(names, "installed")
    # its wheel, built from the old tree, is named for the old dist-info's release
    wheels = [p.name for p in (tmp_path / "cache").glob("shoal-*.whl")]
    assert len(wheels) == 1, wheels
    old_release = wheels[0].split("-")[1]
    assert old_release.startswith("0.0.0+g"), wheels

    client_dir = tmp_path / "client-run"
    client_dir.mkdir()
    nodes = {h.name: f"http://{h.endpoint}" for h in targets}
    client_argv = [
        sys.executable, str(CLIENT), "--secret-file", str(secret), "--nodes", json.dumps(nodes),
        "--dir", str(client_dir), "--python", BASE_PYTHON, "--rate-hz", str(RATE_HZ),
        "--exit-code", str(EXIT_CODE),
    ]  # fmt: skip
    env = {"PYTHONPATH": str(ROOT)}
    client = operator.spawn(client_argv, cwd=ROOT, env=env, name="rolling-client")
    ready = _wait_file(client_dir / "ready.json", client, READY_S)
    status, gang = ready["gang"]
    assert status == 201, gang
    assert gang["state"] == "running", gang
    members = gang["gang"]["members"]
    assert sorted(m["node"] for m in members) == sorted(names), gang
    assert {m["state"] for m in members} == {"running"}, members

    # This release, rolled out one host at a time by this tree's `shoal deploy --rolling`.
    rolled = _run(
        operator,
        [*argv, "--rolling", "--settle-timeout", "120"],
        cwd=ROOT,
        pythonpath=str(ROOT),
        timeout_s=ROLL_S,
    )
    (client_dir / "stop").write_text("stop\n", encoding="utf-8")
    assert rolled.returncode == 0, f"{rolled.stdout}\n{rolled.stderr}"
    report = json.loads(rolled.stdout)
    assert report["stopped_at"] is None, report
    assert sorted(report["order"]) == sorted(names)
    assert report["order"][-1] == report["coordinator_before"], report  # the coordinator last
    new_release = report["hosts"][0]["result"]["version"]
    for outcome in report["hosts"]:
        assert outcome["state"] == "settled", outcome
        assert outcome["result"]["status"] == "upgraded", outcome
        assert outcome["result"]["version"] == new_release, outcome
    assert new_release != old_release

    result = _wait_file(client_dir / "result.json", client, RESULT_S)
    assert client.wait(timeout_s=30) == 0, client.log_tail()
    assert result["stopped_by"] == "stop"
    samples = result["samples"]
    for node in names:  # the samples span the roll: each node went from old to new
        assert releases_seen(samples, node) == [old_release, new_release], node

    terms = coordinators_by_term(samples)
    assert terms, "no sample named a coordinator"
    assert all(len(named) == 1 for named in terms.values()), terms
    assert fewest_answering(samples, names) >= HOSTS // 2 + 1, samples

    acked = [key for key, _ in result["acked"]]
    assert len(acked) >= RATE_HZ * 10, (len(acked), result["refused"][:20])
    assert result["missing"] == {node: [] for node in names}, result["missing"]

    ended = result["gang"]["ended"]
    assert ended.get("state") == "failed", ended
    assert ended["exit_code"] == EXIT_CODE, ended
    members = ended["gang"]["members"]
    assert sorted(m["node"] for m in members) == sorted(names), ended
    # each member exits EXIT_CODE once released; one the gang ended first may be killed
    assert all(m["exit_code"] == EXIT_CODE or m["state"] == "killed" for m in members), members
