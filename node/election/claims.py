"""GPU claims: how a node advertises the GPUs it owns in its membership meta, and the rule that
a GPU two members claim stays with the first (by node id), so no two ranks share a device.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

from health import GPU_ID_HEX_DIGITS as GPU_ID_HEX_DIGITS
from health import short_gpu_id
from node.plan import PlanError

GPU_UUIDS_META = "gpu_uuids"
"""Membership meta key of the GPUs a node owns, comma-separated (see `gpu_uuids_meta`); a list
longer than one meta value continues in `gpu_uuids_1`, `gpu_uuids_2`, ..."""
_CLAIM_ID = re.compile(r"^GPU-([0-9a-f]{8})-([0-9a-f]{2})$")
_WIRE_ID = re.compile(r"^[0-9a-f]{10}$")
GPU_CLAIMED = " is also claimed by "
"""What the `cannot_train` reason of a node whose GPU another node claims says
(`GPU <uuid> is also claimed by <node>`)."""
META_TEXT_CHARS = 256
"""The longest meta value membership gossips (node.membership's MAX_META_TEXT_CHARS)."""


def gpu_claim_id(uuid: str) -> str:
    """How a node advertises a GPU: an NVML UUID cut to its first GPU_ID_HEX_DIGITS hex digits,
    written as the start of the UUID (`GPU-5d8f0e1c-2a` for `GPU-5d8f0e1c-2a3b-...`, so it
    matches what `nvidia-smi -L` prints, and how GPU fault reasons name it); any other text as
    it is."""
    return short_gpu_id(uuid)


def gpu_uuids_meta(uuids: Sequence[str]) -> dict[str, str]:
    """The membership meta entries that advertise `uuids`: each as its `gpu_claim_id`, sent as
    its bare hex digits (`5d8f0e1c2a`), in `gpu_uuids`, continued in `gpu_uuids_1`, ... so
    that no value exceeds META_TEXT_CHARS; {} without GPUs. `gpu_uuids_from_meta` reads them."""
    entries: dict[str, str] = {}
    chunk: list[str] = []
    for uuid in map(_to_wire, map(gpu_claim_id, uuids)):
        if not uuid or "," in uuid or len(uuid) > META_TEXT_CHARS:
            raise PlanError(f"GPU UUID {uuid!r} cannot be advertised")
        if chunk and len(",".join([*chunk, uuid])) > META_TEXT_CHARS:
            entries[_uuid_key(len(entries))] = ",".join(chunk)
            chunk = []
        chunk.append(uuid)
    if chunk:
        entries[_uuid_key(len(entries))] = ",".join(chunk)
    return entries


def gpu_uuids_from_meta(meta: Mapping[str, object]) -> tuple[str, ...]:
    """The GPUs a member advertises (`gpu_uuids_meta`'s entries, read in order), each as its
    `gpu_claim_id`."""
    uuids: list[str] = []
    for part in itertools.count():
        value = meta.get(_uuid_key(part))
        if not isinstance(value, str):
            break
        uuids.extend(_from_wire(uuid) for uuid in value.split(",") if uuid)
    return tuple(uuids)


def _to_wire(claim_id: str) -> str:
    match = _CLAIM_ID.match(claim_id)
    return claim_id if match is None else match.group(1) + match.group(2)


def _from_wire(text: str) -> str:
    return f"GPU-{text[:8]}-{text[8:]}" if _WIRE_ID.match(text) else text


def _uuid_key(part: int) -> str:
    return GPU_UUIDS_META if part == 0 else f"{GPU_UUIDS_META}_{part}"


def gpu_conflicts(claims: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The members that may not train because a member earlier by node id claims one of their
    GPUs, with the reason (`GPU <id> is also claimed by <node>`); `claims` maps node id to the
    GPU ids it advertises. Members whose GPUs are disjoint never appear."""
    owner_of: dict[str, str] = {}
    refused: dict[str, str] = {}
    for node_id in sorted(claims):
        gpus = claims[node_id]
        taken = [(gpu, owner_of[gpu]) for gpu in gpus if owner_of.get(gpu, node_id) != node_id]
        for gpu in gpus:
            owner_of.setdefault(gpu, node_id)
        if taken:
            gpu, owner = taken[0]
            refused[node_id] = f"GPU {gpu}{GPU_CLAIMED}{owner}"
    return refused
