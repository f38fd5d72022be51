"""The weights digest shoal-pws64-v1: the torch code equals a plain-Python reading of the
definition in docs/gpus.md, is independent of chunking, catches flipped bits, swapped words and
tensors, truncation and header changes, and gives the same value on CUDA as on the CPU."""

from __future__ import annotations

import hashlib
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from node.errors import WeightsError

torch = pytest.importorskip("torch")

from node.rl.digest import (  # noqa: E402
    PWS_ALGO,
    PWS_BLOCK_WORDS,
    PWS_FAMILY_SEEDS,
    SHA256_ALGO,
    Digest,
    HostStaging,
    WeightsDigest,
    digest_named,
    pws_sums,
)

VECTOR_DIGEST = "f63e9c1ae49abeaf7eb3c532a84b92a60d1c5297a9a4f7c7e59db9d05b3c7fc3"
"""The test vector of docs/gpus.md ("Weights digest"): `vector()`'s shoal-pws64-v1 value."""
MASK = (1 << 64) - 1
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def vector() -> list[tuple[str, Any]]:
    return [
        ("a", torch.arange(10, dtype=torch.float32)),
        ("b", torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)),
        ("c", torch.arange(-3, 4, dtype=torch.int8)),  # 7 bytes: a padded last word
    ]


def mix64(z: int) -> int:
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference(named: list[tuple[str, Any]]) -> str:
    """docs/gpus.md's definition in plain Python: bytes, words, weights, sums, records."""
    digest = hashlib.sha256(b"shoal-pws64-v1\x00")
    for name, tensor in named:
        data = bytes(tensor.contiguous().reshape(-1).view(torch.uint8).tolist())
        padded = data + b"\x00" * (-len(data) % 4)
        words = struct.unpack(f"<{len(padded) // 4}i", padded)
        sums = []
        for seed_w, seed_q in PWS_FAMILY_SEEDS:
            total = 0
            for i, word in enumerate(words):
                weight = mix64(seed_w + i % PWS_BLOCK_WORDS) | 1
                scale = mix64(seed_q + i // PWS_BLOCK_WORDS) | 1
                total += word * weight * scale
            sums.append(total & MASK)
        dtype = str(tensor.dtype).removeprefix("torch.").encode()
        shape = tuple(tensor.shape)
        digest.update(struct.pack("<I", len(name.encode())) + name.encode())
        digest.update(struct.pack("<I", len(dtype)) + dtype)
        digest.update(struct.pack(f"<I{len(shape)}Q", len(shape), *shape))
        digest.update(struct.pack("<QQQ", len(data), *sums))
    return digest.hexdigest()


def pws(named: list[tuple[str, Any]]) -> str:
    return digest_named(named, PWS_ALGO).value


def big() -> Any:
    """Two full blocks of words and part of a third, with an odd tail: 2 * L + 5 words + 1 byte."""
    generator = torch.Generator().manual_seed(3)
    count = (2 * PWS_BLOCK_WORDS + 5) * 2 + 1
    return torch.randn(count, generator=generator).to(torch.bfloat16)


def test_the_test_vector_is_pinned_and_follows_the_definition() -> None:
    assert pws(vector()) == VECTOR_DIGEST
    assert reference(vector()) == VECTOR_DIGEST
    assert digest_named(vector()) == Digest(PWS_ALGO, VECTOR_DIGEST)  # the default algo


def test_sums_over_several_blocks_follow_the_definition_for_any_chunking() -> None:
    tensor = big()
    expected = reference([("w", tensor)])
    assert pws([("w", tensor)]) == expected
    sums = [pws_sums(tensor, chunk).tolist() for chunk in (1, 2, 3, 1000)]
    assert all(found == sums[0] for found in sums)
    with pytest.raises(WeightsError, match="chunk_blocks"):
        pws_sums(tensor, 0)


def test_equal_weights_give_equal_digests_and_layout_does_not_matter() -> None:
    assert pws(vector()) == pws(vector())
    matrix = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    transposed = matrix.t()  # not contiguous: its row-major bytes count
    assert pws([("m", transposed)]) == pws([("m", transposed.contiguous())])
    flat = torch.arange(9, dtype=torch.bfloat16)
    shifted = flat[1:]  # starts 2 bytes into the storage: no aligned int32 view
    assert pws([("s", shifted)]) == pws([("s", shifted.clone())])
    with ThreadPoolExecutor(2) as pool:  # CPU sums in a pool give the same value
        assert digest_named(vector(), PWS_ALGO, pool=pool).value == VECTOR_DIGEST
    empty = [("e", torch.zeros(0)), ("z", torch.zeros(()))]
    assert pws(empty) == reference(empty)


def flipped(tensor: Any, byte: int, bit: int) -> Any:
    raw = tensor.clone().reshape(-1).view(torch.uint8)
    raw[byte] ^= 1 << bit
    return raw.view(tensor.dtype).reshape(tensor.shape)


def test_every_flipped_bit_changes_the_digest() -> None:
    odd = torch.arange(-3, 4, dtype=torch.int8)
    before = pws([("c", odd)])
    for byte in range(7):  # every bit, the last byte of the odd-sized tensor included
        for bit in range(8):
            assert pws([("c", flipped(odd, byte, bit))]) != before, (byte, bit)
    tensor = big()
    before = pws([("w", tensor)])
    nbytes = tensor.numel() * 2
    boundary = PWS_BLOCK_WORDS * 4  # the first byte of the second block
    for byte in (0, 3, boundary - 1, boundary, 2 * boundary + 7, nbytes - 1):
        for bit in (0, 7):
            assert pws([("w", flipped(tensor, byte, bit))]) != before, (byte, bit)


def test_swapped_words_and_tensors_truncation_and_headers_change_the_digest() -> None:
    base = vector()
    before = pws(base)
    words = base[0][1].clone().view(torch.int32)
    words[[2, 3]] = words[[3, 2]]  # two 4-byte words swapped
    assert pws([("a", words.view(torch.float32)), *base[1:]]) != before
    tensor = big()
    far = tensor.clone().view(torch.int16)[: 2 * (2 * PWS_BLOCK_WORDS)].view(torch.int32)
    far[[1, PWS_BLOCK_WORDS + 1]] = far[[PWS_BLOCK_WORDS + 1, 1]]  # same offset, other block
    swapped = torch.cat([far.view(torch.bfloat16), tensor[far.numel() * 2 :]])
    assert pws([("w", swapped)]) != pws([("w", tensor)])
    first, second = torch.ones(4), torch.full((4,), 2.0)
    assert pws([("x", first), ("y", second)]) != pws([("x", second), ("y", first)])
    assert pws([("x", first), ("y", second)]) != pws([("y", second), ("x", first)])
    assert pws([("a", base[0][1][:-1]), *base[1:]]) != before  # truncated
    zeros = torch.zeros(8)
    assert pws([("z", zeros)]) != pws([("z", zeros[:-1])])  # even when the bytes cut are 0
    assert pws([("a", base[0][1].view(torch.int32)), *base[1:]]) != before  # dtype
    assert pws([("a", base[0][1].reshape(2, 5)), *base[1:]]) != before  # shape
    assert pws([("A", base[0][1]), *base[1:]]) != before  # name
    assert pws(base[:2]) != before  # a tensor left out


def test_the_sha256_algo_stays_the_previous_releases_and_unknown_algos_are_refused() -> None:
    model = torch.nn.Linear(3, 2)
    expected = hashlib.sha256()
    for name, param in model.named_parameters():
        data = bytes(param.detach().reshape(-1).view(torch.uint8).tolist())
        expected.update(f"{name}:{param.dtype}:{tuple(param.shape)};".encode())
        expected.update(hashlib.sha256(data).digest())
    assert digest_named(model.named_parameters(), SHA256_ALGO).value == expected.hexdigest()
    with pytest.raises(WeightsError, match="not known to this release"):
        WeightsDigest("md5")


def test_a_message_names_its_digest_or_the_previous_releases_sha256() -> None:
    sha = Digest(SHA256_ALGO, "ab" * 32)
    assert sha.fields() == {"digest": sha.to_dict(), "sha256": sha.value}
    new = Digest(PWS_ALGO, "cd" * 32)
    assert new.fields() == {"digest": new.to_dict()}
    assert Digest.of_message(new.fields()) == new
    assert Digest.of_message({"sha256": sha.value}) == sha
    assert Digest.of_message({"version": 1}) is None
    assert Digest.of_message({"digest": {"algo": 1, "value": "x"}}) is None


@pytest.mark.gpu
@cuda
def test_the_digest_on_cuda_equals_the_digest_of_cpu_copies() -> None:
    named = [*vector(), ("w", big()), ("m", torch.randn(33, 17).t())]
    on_cpu = {algo: digest_named(named, algo) for algo in (PWS_ALGO, SHA256_ALGO)}
    on_gpu = [(name, tensor.cuda()) for name, tensor in named]
    staging = HostStaging()
    for algo, expected in on_cpu.items():
        assert digest_named(on_gpu, algo, staging=staging) == expected, algo
    assert digest_named(on_gpu[:3], PWS_ALGO) == Digest(PWS_ALGO, VECTOR_DIGEST)
    allocated = staging.nbytes
    assert allocated > 0
    digest_named(on_gpu, SHA256_ALGO, staging=staging)
    assert staging.nbytes == allocated  # the pinned buffer is reused, not reallocated
    tensor = big().cuda()
    sums = [pws_sums(tensor, chunk).cpu().tolist() for chunk in (1, 3, 64)]
    assert all(found == sums[0] for found in sums)
    assert sums[0] == pws_sums(tensor.cpu()).tolist()
