"""Bucketed weight broadcast from the trainer (group rank 0) to receivers over torch.distributed.

Wire order on the group: one int64 header [version, parameter count, total bytes], then the
parameters in `named_parameters()` order: small ones packed into flat buffers of one dtype of at
most `bucket_bytes` each, tensors of ALONE_BYTES or more sent alone and received in place (no
copy: copies of large tensors cost more than the collective on a busy CPU). torch is imported
lazily.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

from node.errors import WeightsError
from node.rl.digest import WeightsDigest

DEFAULT_BUCKET_BYTES = 32 * 1024 * 1024
"""Bucket size of a broadcast: large enough that per-collective latency stops mattering."""
ALONE_BYTES = 1024 * 1024
"""A tensor this large is its own bucket, sent and received without a copy."""


class ParamJson(TypedDict):
    """One parameter in an offer's `params` (ParamInfo.to_dict)."""

    name: str
    shape: list[int]
    dtype: str
    nbytes: int


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """One parameter as the control plane describes it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def to_dict(self) -> ParamJson:
        return ParamJson(
            name=self.name, shape=list(self.shape), dtype=self.dtype, nbytes=self.nbytes
        )


def describe_params(model: Any) -> list[ParamInfo]:
    """Name, shape, dtype and size of every parameter of `model`, in broadcast order."""
    return [
        ParamInfo(
            name, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.numel() * p.element_size()
        )
        for name, p in model.named_parameters()
    ]


def plan_buckets(
    sizes: Sequence[tuple[str, int]], bucket_bytes: int, alone_bytes: int = ALONE_BYTES
) -> list[list[int]]:
    """Indices of consecutive parameters grouped into buckets: one dtype per bucket, at most
    `bucket_bytes` each; a tensor larger than a bucket or of `alone_bytes` or more goes alone;
    `bucket_bytes` <= 0 means one per tensor.

    `sizes` is (dtype, nbytes) per parameter.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    current_dtype, current_bytes, current_small = "", 0, True
    for index, (dtype, nbytes) in enumerate(sizes):
        small = nbytes < alone_bytes
        fits = current and dtype == current_dtype and current_bytes + nbytes <= bucket_bytes
        if not (fits and small and current_small) and current:
            buckets.append(current)
            current, current_bytes = [], 0
        if not current:
            current_small = small
        current.append(index)
        current_dtype, current_bytes = dtype, current_bytes + nbytes
    if current:
        buckets.append(current)
    return buckets


def broadcast_weights(
    model: Any,
    worker_group: Any,
    version: int,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout_s: float | None = None,
) -> None:
    """Send `model`'s parameters and `version` from this process (rank 0 of `worker_group`, a
    torch ProcessGroup or None for the default group) to every other rank. Each collective
    waits at most `timeout_s` (default: the group's own timeout); WeightsError on failure."""
    torch = _torch()
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise WeightsError(f"weights version {version!r} must be an integer >= 0")
    params = [p for _, p in model.named_parameters()]
    total = sum(p.numel() * p.element_size() for p in params)
    header = torch.tensor([version, len(params), total], dtype=torch.int64, device=_device(params))
    _broadcast(worker_group, header, timeout_s)
    with torch.no_grad():
        for bucket in _buckets(params, bucket_bytes):
            tensors = [params[i].detach() for i in bucket]
            if len(tensors) == 1:
                buffer = tensors[0].contiguous()
            else:
                buffer = torch.cat([t.reshape(-1) for t in tensors])
            _broadcast(worker_group, buffer, timeout_s)


def receive_weights(
    model: Any,
    trainer_group: Any,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout_s: float | None = None,
    digest: WeightsDigest | None = None,
) -> int:
    """Receive a broadcast of `broadcast_weights` into `model` in place; return its version.

    The bucket size must match the sender's. WeightsError when the sender's parameter count or
    size differ from this model's (the parameters are then left untouched). With `digest`, each
    bucket is added to it as soon as it landed, summed (or hashed) while the next one arrives.
    """
    torch = _torch()
    names = [name for name, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    total = sum(p.numel() * p.element_size() for p in params)
    header = torch.zeros(3, dtype=torch.int64, device=_device(params))
    _broadcast(trainer_group, header, timeout_s)
    version, count, sent_total = (int(v) for v in header.tolist())
    if count != len(params) or sent_total != total:
        raise WeightsError(
            f"the trainer sends {count} parameters ({sent_total} bytes) but this model has "
            f"{len(params)} ({total} bytes); load the same architecture on both sides"
        )
    with torch.no_grad():
        for bucket in _buckets(params, bucket_bytes):
            targets = [params[i] for i in bucket]
            if len(targets) == 1 and targets[0].is_contiguous():
                _broadcast(trainer_group, targets[0].detach(), timeout_s)  # in place
            else:
                numel = sum(t.numel() for t in targets)
                buffer = torch.empty(numel, dtype=targets[0].dtype, device=targets[0].device)
                _broadcast(trainer_group, buffer, timeout_s)
                offset = 0
                for target in targets:
                    piece = buffer[offset : offset + target.numel()].view(target.shape)
                    target.copy_(piece)
                    offset += target.numel()
            if digest is not None:
                for index in bucket:
                    digest.add(names[index], params[index])
    return version


def _buckets(params: Sequence[Any], bucket_bytes: int) -> Iterator[list[int]]:
    sizes = [(str(p.dtype), p.numel() * p.element_size()) for p in params]
    yield from plan_buckets(sizes, bucket_bytes)


def _device(params: Sequence[Any]) -> Any:
    """Where the collectives' buffers live: the parameters' device (NCCL needs CUDA tensors)."""
    return params[0].device if params else "cpu"


def _broadcast(group: Any, tensor: Any, timeout_s: float | None) -> None:
    dist = _dist()
    try:
        if group is None:
            work = dist.broadcast(tensor, src=0, async_op=True)
        else:
            options = dist.BroadcastOptions()
            options.rootRank = 0
            work = group.broadcast([tensor], options)
        if timeout_s is None:
            work.wait()
        else:
            work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise WeightsError(f"weight broadcast failed: {exc}") from exc


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise WeightsError(f"torch is not installed ({exc}); install shoal[torch]") from exc
    return torch


def _dist() -> Any:
    return torch_distributed()


def torch_distributed() -> Any:
    """torch.distributed, imported on first use (typed Any: its stubs hide TCPStore)."""
    import torch.distributed as dist

    return dist
