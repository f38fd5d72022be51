"""Weights digests: `shoal-pws64-v1`, computed where the tensors live (on the GPU for CUDA
tensors, with the same integer torch ops and the identical value on the CPU), and the previous
release's `sha256` tree digest. docs/gpus.md ("Weights digest") defines both bit by bit.

Device-to-host copies go through a HostStaging: one page-locked buffer reused for every copy.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from node.errors import WeightsError

PWS_ALGO = "shoal-pws64-v1"
"""Position-weighted 64-bit word sums, two families, combined with sha256 (docs/gpus.md)."""
SHA256_ALGO = "sha256"
"""The previous release's digest: sha256 over headers and the sha256 of each 8 MiB piece."""
ALGOS = (PWS_ALGO, SHA256_ALGO)

PWS_BLOCK_WORDS = 1 << 16
"""L: the position weights repeat with period L words inside a block, scaled per block."""
PWS_FAMILY_SEEDS = ((1 << 56, 2 << 56), (3 << 56, 4 << 56))
"""(A_f, B_f) of each family f: W_f(j) = mix64(A_f + j) | 1, Q_f(c) = mix64(B_f + c) | 1."""
PWS_DOMAIN = b"shoal-pws64-v1\x00"
CHUNK_BLOCKS = {"cpu": 8, "cuda": 64}
"""Blocks summed per kernel: bounds the int64 temporary (blocks * 2 * L * 8 bytes); the
value does not depend on it."""
DIGEST_CHUNK_BYTES = 8 * 1024 * 1024
"""sha256: piece of a parameter's bytes hashed on its own (in parallel with the others)."""

_MASK64 = (1 << 64) - 1
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB


class DigestFieldsJson(TypedDict):
    """A message's digest fields (Digest.fields): `digest`, and `sha256` beside algo sha256."""

    digest: dict[str, str]
    sha256: NotRequired[str]


@dataclass(frozen=True, slots=True)
class Digest:
    """A weights digest as messages carry it: `{"algo": NAME, "value": HEX}`."""

    algo: str
    value: str

    def to_dict(self) -> dict[str, str]:
        return {"algo": self.algo, "value": self.value}

    def fields(self) -> DigestFieldsJson:
        """The message fields: `digest`, and the previous release's `sha256` when the algo is
        sha256 (so an older receiver or publisher still reads it)."""
        found = DigestFieldsJson(digest=self.to_dict())
        if self.algo == SHA256_ALGO:
            found["sha256"] = self.value
        return found

    @classmethod
    def of_message(cls, message: Mapping[str, Any]) -> Digest | None:
        """The digest of an offer, applied report or status: its `digest` object, or the
        previous release's `sha256` field; None when it has neither or they are malformed."""
        found = message.get("digest")
        if isinstance(found, Mapping):
            algo, value = found.get("algo"), found.get("value")
            if isinstance(algo, str) and isinstance(value, str):
                return cls(algo, value)
            return None
        sha = message.get("sha256")
        return cls(SHA256_ALGO, sha) if isinstance(sha, str) else None


class HostStaging:
    """One page-locked host buffer for the device-to-host copies of one publisher or receiver,
    allocated on first use and reused (it only grows). Copies are synchronous; a view returned
    by `to_host` is valid until the next call. Not thread-safe: one owner thread at a time."""

    def __init__(self) -> None:
        self._buffer: Any = None

    def to_host(self, tensor: Any) -> Any:
        """The bytes of `tensor` (on any device) as a flat uint8 CPU tensor in the buffer."""
        torch = _torch()
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        nbytes = data.numel()
        if self._buffer is None or self._buffer.numel() < nbytes:
            size = max(nbytes, 4096 if self._buffer is None else 2 * self._buffer.numel())
            self._buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        view = self._buffer[:nbytes]
        view.copy_(data)
        return view

    @property
    def nbytes(self) -> int:
        """Bytes allocated (0 before the first copy)."""
        return 0 if self._buffer is None else int(self._buffer.numel())


class WeightsDigest:
    """A weights digest of `algo`, built as parameters are added in broadcast order.

    shoal-pws64-v1: each tensor's word sums run on its device (CUDA kernels are queued, not
    waited for; CPU tensors are summed in `pool` when given, beside what the caller does next);
    `result()` copies every CUDA tensor's 16 bytes through `staging` in one copy.
    sha256: pieces are hashed in `pool` (hashlib lets go of the GIL); CUDA tensors are copied
    through `staging` piece by piece. An added tensor must not change until `result()` returned.
    """

    def __init__(
        self,
        algo: str = PWS_ALGO,
        *,
        pool: Executor | None = None,
        staging: HostStaging | None = None,
    ) -> None:
        if algo not in ALGOS:
            raise WeightsError(
                f"weights digest algo {algo!r} is not known to this release (known: "
                f"{', '.join(ALGOS)}); upgrade this node to the publisher's release"
            )
        self.algo = algo
        self._pool = pool
        self._staging = staging
        self._records: list[tuple[bytes, Any]] = []

    def add(self, name: str, param: Any) -> None:
        tensor = param.detach()
        if self.algo == PWS_ALGO:
            header = pws_header(name, tensor)
            if tensor.device.type == "cpu" and self._pool is not None:
                self._records.append((header, self._pool.submit(pws_sums, tensor)))
            else:
                self._records.append((header, pws_sums(tensor)))
            return
        header = f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode()
        if tensor.device.type == "cpu":
            host = tensor.contiguous()
            data = _tensor_bytes(host)
            pieces = [
                data[at : at + DIGEST_CHUNK_BYTES] for at in range(0, len(data), DIGEST_CHUNK_BYTES)
            ]
            submitted = [self._submit(_sha256, piece) for piece in pieces or [data]]
            self._records.append((header, (submitted, host)))  # host keeps its bytes alive
            return
        staging = self._staging_buffer()
        flat = tensor.contiguous().reshape(-1).view(_torch().uint8)
        hashes: list[Future[bytes]] = []
        for at in range(0, max(1, flat.numel()), DIGEST_CHUNK_BYTES):
            host = staging.to_host(flat[at : at + DIGEST_CHUNK_BYTES])
            hashes.append(_done(_sha256(_tensor_bytes(host))))
        self._records.append((header, (hashes, None)))

    def result(self) -> Digest:
        if self.algo == SHA256_ALGO:
            digest = hashlib.sha256()
            for header, (hashes, _) in self._records:
                digest.update(header)
                for piece in hashes:
                    digest.update(piece.result())
            return Digest(self.algo, digest.hexdigest())
        sums = self._pws_values()
        digest = hashlib.sha256(PWS_DOMAIN)
        for (header, _), (first, second) in zip(self._records, sums, strict=True):
            digest.update(header)
            digest.update(struct.pack("<QQ", first & _MASK64, second & _MASK64))
        return Digest(self.algo, digest.hexdigest())

    def hexdigest(self) -> str:
        return self.result().value

    def _pws_values(self) -> list[tuple[int, int]]:
        torch = _torch()
        values: list[Any] = [
            found.result() if isinstance(found, Future) else found for _, found in self._records
        ]
        on_device = [i for i, value in enumerate(values) if value.device.type != "cpu"]
        if on_device:
            stacked = torch.stack([values[i].to(values[on_device[0]].device) for i in on_device])
            host = self._staging_buffer().to_host(stacked).view(torch.int64).view(-1, 2)
            for row, index in enumerate(on_device):
                values[index] = host[row].clone()
        return [(int(value[0]), int(value[1])) for value in values]

    def _submit(self, fn: Any, piece: memoryview) -> Future[bytes]:
        if self._pool is None:
            return _done(fn(piece))
        return self._pool.submit(fn, piece)

    def _staging_buffer(self) -> HostStaging:
        if self._staging is None:
            self._staging = HostStaging()
        return self._staging


def pws_header(name: str, tensor: Any) -> bytes:
    """The record of a tensor before its sums: name, dtype, shape and byte length."""
    encoded = name.encode()
    dtype = str(tensor.dtype).removeprefix("torch.").encode()
    shape = tuple(int(d) for d in tensor.shape)
    nbytes = tensor.numel() * tensor.element_size()
    return b"".join(
        (
            struct.pack("<I", len(encoded)),
            encoded,
            struct.pack("<I", len(dtype)),
            dtype,
            struct.pack("<I", len(shape)),
            struct.pack(f"<{len(shape)}Q", *shape),
            struct.pack("<Q", nbytes),
        )
    )


def pws_sums(tensor: Any, chunk_blocks: int | None = None) -> Any:
    """(T_0, T_1) of one tensor: an int64 tensor of 2 on the tensor's device (docs/gpus.md).
    `chunk_blocks` (default per device) bounds temporary memory; the value does not depend
    on it."""
    torch = _torch()
    device = tensor.device
    if chunk_blocks is None:
        chunk_blocks = CHUNK_BLOCKS.get(device.type, CHUNK_BLOCKS["cuda"])
    if chunk_blocks < 1:
        raise WeightsError(f"chunk_blocks {chunk_blocks} must be at least 1")
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    nbytes = data.numel()
    whole = nbytes - nbytes % 4
    if data.storage_offset() % 4:
        data = data.clone()  # an int32 view needs 4-byte alignment
    words = data[:whole].view(torch.int32)
    count = whole // 4
    length = PWS_BLOCK_WORDS
    full, rest = divmod(count, length)
    weights, scales = _tables(device, full + 1)
    total = torch.zeros(2, dtype=torch.int64, device=device)
    for first in range(0, full, chunk_blocks):
        blocks = min(chunk_blocks, full - first)
        chunk = words[first * length : (first + blocks) * length].view(blocks, 1, length)
        sums = (chunk * weights).sum(-1)  # (blocks, 2): S_f(c) mod 2^64
        total += (sums * scales[:, first : first + blocks].t()).sum(0)
    if rest:
        sums = (words[full * length :] * weights[:, :rest]).sum(-1)
        total += sums * scales[:, full]
    if whole < nbytes:
        padded = torch.zeros(4, dtype=torch.uint8, device=device)
        padded[: nbytes - whole] = data[whole:]
        total += padded.view(torch.int32) * weights[:, rest] * scales[:, full]
    return total


_TABLES: dict[str, tuple[Any, Any]] = {}
_TABLES_LOCK = threading.Lock()


def _tables(device: Any, blocks: int) -> tuple[Any, Any]:
    """W (2, L) and Q (2, at least `blocks`) on `device`, computed there once and cached."""
    key = str(device)
    with _TABLES_LOCK:
        found = _TABLES.get(key)
        if found is not None and found[1].shape[1] >= blocks:
            return found
        torch = _torch()
        size = max(64, 1 << (blocks - 1).bit_length())
        weights = found[0] if found is not None else _mix_table(torch, device, 0, PWS_BLOCK_WORDS)
        scales = _mix_table(torch, device, 1, size)
        _TABLES[key] = (weights, scales)
        return weights, scales


def _mix_table(torch: Any, device: Any, which: int, size: int) -> Any:
    """mix64(seed_f + k) | 1 for k < size, both families: (2, size) int64 on `device`."""
    positions = torch.arange(size, dtype=torch.int64, device=device)
    rows = [_mix64(torch, positions + _signed(seeds[which])) | 1 for seeds in PWS_FAMILY_SEEDS]
    return torch.stack(rows)


def _mix64(torch: Any, z: Any) -> Any:
    """splitmix64's finalizer on int64 tensors (two's complement, wrapping multiplication)."""
    z = (z ^ _shift_right(z, 30)) * _signed(_MIX_1)
    z = (z ^ _shift_right(z, 27)) * _signed(_MIX_2)
    return z ^ _shift_right(z, 31)


def _shift_right(z: Any, bits: int) -> Any:
    """A logical right shift of int64 (torch shifts arithmetically)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def hash_pool() -> ThreadPoolExecutor:
    """A pool for WeightsDigest: one thread per core (at most 8); the caller closes it."""
    return ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="weights-digest")


def digest_named(
    named: Iterable[tuple[str, Any]],
    algo: str = PWS_ALGO,
    *,
    pool: Executor | None = None,
    staging: HostStaging | None = None,
) -> Digest:
    """The digest of (name, tensor) pairs in order; sha256 hashes on every core (in `pool`,
    or a pool of its own)."""
    if algo == SHA256_ALGO and pool is None:
        with hash_pool() as own:
            return digest_named(named, algo, pool=own, staging=staging)
    digest = WeightsDigest(algo, pool=pool, staging=staging)
    for name, param in named:
        digest.add(name, param)
    return digest.result()


def weights_digest(model: Any, algo: str = PWS_ALGO) -> Digest:
    """The digest of `model`'s parameters in broadcast order."""
    return digest_named(model.named_parameters(), algo)


def _done(value: bytes) -> Future[bytes]:
    future: Future[bytes] = Future()
    future.set_result(value)
    return future


def _sha256(data: memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def _tensor_bytes(tensor: Any) -> memoryview:
    """A view of a contiguous CPU tensor's bytes (no copy; valid while the tensor lives)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise WeightsError(f"torch is not installed ({exc}); install shoal[torch]") from exc
    return torch
