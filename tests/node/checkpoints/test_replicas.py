"""Where copies go, as a table: across zones first, then racks, then the least loaded node; and
the repairs that bring an owner's copies back to `checkpoint_replicas` when holders die."""

from __future__ import annotations

import pytest

from config import Inventory
from node.checkpoints.replicas import Domain, choose_holders, domains_of, plan_replicas, repairs
from node.locks.checkpoints import CheckpointFile, CommittedStep

ZONES = {
    "a1": Domain("a", "r1"),
    "a2": Domain("a", "r2"),
    "a3": Domain("a", "r1"),
    "b1": Domain("b", "r3"),
    "b2": Domain("b", "r4"),
    "c1": Domain("c", "r5"),
}


@pytest.mark.parametrize(
    ("owner", "candidates", "count", "domains", "keeping", "chosen"),
    [
        pytest.param("n1", ["n1", "n2", "n3"], 2, {}, [], ("n2", "n3"), id="no labels: by id"),
        pytest.param("n1", ["n1", "n2"], 2, {}, [], ("n2",), id="fewer nodes than copies"),
        pytest.param("n1", ["n1"], 2, {}, [], (), id="alone"),
        pytest.param("a1", list(ZONES), 2, ZONES, [], ("b1", "c1"), id="two other zones"),
        pytest.param("a1", list(ZONES), 3, ZONES, [], ("b1", "c1", "a2"), id="then another rack"),
        pytest.param("a1", ["a1", "a2", "a3"], 1, ZONES, [], ("a2",), id="one zone: other rack"),
        pytest.param("a1", list(ZONES), 1, ZONES, ["b2"], ("c1",), id="a zone no holder has"),
        pytest.param(
            "a1", ["a1", "a3", "x"], 1, ZONES, [], ("x",), id="an unlabelled node before a rack"
        ),
    ],
)
def test_choose_holders(
    owner: str,
    candidates: list[str],
    count: int,
    domains: dict[str, Domain],
    keeping: list[str],
    chosen: tuple[str, ...],
) -> None:
    assert choose_holders(owner, candidates, count, domains, keeping=keeping) == chosen


def test_copies_spread_over_nodes_when_domains_do_not_decide() -> None:
    nodes = [f"n{i}" for i in range(6)]
    plan = plan_replicas(nodes, nodes, 2, {}, holders={n: (n,) for n in nodes})
    copies = [node for chosen in plan.values() for node in chosen]
    assert all(owner not in chosen and len(chosen) == 2 for owner, chosen in plan.items())
    assert max(copies.count(n) for n in nodes) - min(copies.count(n) for n in nodes) <= 1


def test_replicas_zero_plans_nothing() -> None:
    assert plan_replicas(["n1", "n2"], ["n1", "n2"], 0, {}) == {}


def record(
    holders: dict[str, tuple[str, ...]], targets: dict[str, tuple[str, ...]]
) -> CommittedStep:
    files = {
        owner: (CheckpointFile(f"step-00000001-g0/{owner}", 1, "0" * 64),) for owner in holders
    }
    return CommittedStep(1, 0, 2, 0.0, files, holders, targets)


@pytest.mark.parametrize(
    ("holders", "targets", "alive", "wanted"),
    [
        pytest.param({"n1": ("n1", "n2", "n3")}, {}, ["n1", "n2", "n3", "n4"], {}, id="enough"),
        pytest.param(
            {"n1": ("n1", "n2", "n3")}, {}, ["n1", "n2", "n4"], {"n1": ("n4",)}, id="a holder died"
        ),
        pytest.param({"n1": ("n1", "n2")}, {"n1": ("n3",)}, ["n1", "n2", "n3"], {}, id="asked"),
        pytest.param(
            {"n1": ("n1", "n2")},
            {"n1": ("n3",)},
            ["n1", "n2", "n4"],
            {"n1": ("n4",)},
            id="an asked node died",
        ),
        pytest.param({"n1": ("n1", "n2")}, {}, ["n1", "n2"], {}, id="nobody left to ask"),
    ],
)
def test_repairs(
    holders: dict[str, tuple[str, ...]],
    targets: dict[str, tuple[str, ...]],
    alive: list[str],
    wanted: dict[str, tuple[str, ...]],
) -> None:
    assert repairs(record(holders, targets), alive, 2, {}) == wanted


def test_domains_come_from_the_inventorys_zone_and_rack_labels() -> None:
    inventory = Inventory.model_validate(
        {
            "hosts": {
                "gpu-a": {"ssh_host": "10.0.0.1", "labels": {"zone": "eu-1", "rack": "r7"}},
                "gpu-b": {"ssh_host": "10.0.0.2", "labels": {"zone": "eu-2"}},
                "gpu-c": {"ssh_host": "10.0.0.3"},
            }
        }
    )
    assert domains_of(inventory) == {
        "gpu-a": Domain("eu-1", "r7"),
        "gpu-b": Domain("eu-2", None),
        "gpu-c": Domain(None, None),
    }
    assert domains_of(None) == {}
