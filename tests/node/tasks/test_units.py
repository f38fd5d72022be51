"""Decisions of node.tasks without sockets: the actor registry, backend specs, placement."""

from __future__ import annotations

import pytest

from node.errors import RegistryError
from node.tasks import (
    ActorRegistry,
    SyncContext,
    TaskError,
    ThreadContext,
    current_context,
    parse_spec,
    place,
)
from node.tasks.registry import PENDING_TTL_S


def test_claim_is_get_or_create_and_incarnations_only_grow() -> None:
    registry = ActorRegistry()
    registry.fence(3)
    record, created = registry.claim("a", get_if_exists=True, now=0.0)
    assert created
    assert record.incarnation == 1
    assert record.state == "pending"
    again, created = registry.claim("a", get_if_exists=True, now=1.0)
    assert not created
    assert again == record
    with pytest.raises(RegistryError) as exists:
        registry.claim("a", get_if_exists=False, now=1.0)
    assert exists.value.status == 409
    ready = registry.ready("a", 1, "10.0.0.2:4000", "j-1")
    assert (ready.state, ready.address, ready.term) == ("ready", "10.0.0.2:4000", 3)
    registry.dead("a", 1)
    reborn, created = registry.claim("a", get_if_exists=True, now=2.0)
    assert created
    assert reborn.incarnation == 2
    with pytest.raises(RegistryError, match="not current"):
        registry.ready("a", 1, "10.0.0.2:4001", "j-2")
    with pytest.raises(RegistryError, match="not current"):
        registry.dead("a", 1)
    assert registry.lookup("a").incarnation == 2


def test_an_abandoned_claim_expires() -> None:
    registry = ActorRegistry()
    registry.fence(1)
    registry.claim("a", get_if_exists=True, now=0.0)
    record, created = registry.claim("a", get_if_exists=True, now=PENDING_TTL_S + 1)
    assert created
    assert record.incarnation == 2


def test_a_new_term_forgets_the_old_terms_names() -> None:
    registry = ActorRegistry()
    registry.fence(1)
    registry.claim("a", get_if_exists=True, now=0.0)
    registry.fence(1)
    assert registry.lookup("a").term == 1
    registry.fence(2)
    with pytest.raises(RegistryError) as missing:
        registry.lookup("a")
    assert missing.value.status == 404


def test_parse_spec() -> None:
    assert parse_spec("ray?address=auto").options == {"address": "auto"}
    spec = parse_spec("shoal?daemon=http://10.0.0.5:8770&role=training&workers=4")
    assert spec.backend == "shoal"
    assert spec.options == {"daemon": "http://10.0.0.5:8770", "role": "training", "workers": "4"}
    with pytest.raises(TaskError, match="unknown backend"):
        parse_spec("dask")
    with pytest.raises(TaskError, match="not \\['address'\\]"):
        parse_spec("thread?address=x")


def test_current_context_follows_shoal_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_CONTEXT", "sync")
    context = current_context()
    assert isinstance(context, SyncContext)
    assert current_context() is context
    threaded = current_context("thread?workers=2")
    assert isinstance(threaded, ThreadContext)
    threaded.close()


def test_place_by_role_and_gpus() -> None:
    members = [
        {"node_id": "a", "state": "alive", "role": "training", "meta": {"gpu_count": 2}},
        {"node_id": "b", "state": "alive", "role": "training", "meta": {"gpu_count": 8}},
        {"node_id": "c", "state": "dead", "role": "training", "meta": {"gpu_count": 8}},
        {"node_id": "d", "state": "alive", "role": "inference", "meta": {"gpu_count": 8}},
        {"node_id": "e", "state": "alive", "role": "training", "meta": {}},
    ]
    assert place(members, "training", 1) == ["b", "a"]
    assert place(members, "training", 4) == ["b"]
    assert place(members, "any", 4) == ["b", "d"]
    assert place(members, "training", 0) == ["b", "a", "e"]
