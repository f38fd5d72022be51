"""bench/gpu_check.py where no GPU is: it prints one JSON document saying CUDA is absent and
exits 0; its parsers, judges and section runner, which decide the verdict on a GPU host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import gpu_check
from bench.gpu_check import (
    SmiGpu,
    compare_nvml,
    complete_generation,
    gpu_test_files,
    judge_group,
    last_json_line,
    parse_pytest_summary,
    parse_smi,
    run_sections,
    same_digest,
    split_gpus,
    training_verdict,
)
from tests.conftest import cuda_missing

ROOT = Path(__file__).resolve().parents[1]
H100 = "0, GPU-5e8f3c2a-1b2c-4d5e-8f90-0123456789ab, NVIDIA H100 80GB HBM3, 81559, 34, 71.25"


def test_without_cuda_it_prints_one_json_document_and_exits_0() -> None:
    reason = cuda_missing()
    if reason is None:
        pytest.skip("this host has CUDA: the check runs for real here (see the gpu marker)")
    run = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["cuda"] is False
    assert document["skipped"].startswith("no CUDA")
    assert document["sections"] == {}
    assert document["params"] == 100_000_000


def test_hidden_cuda_is_a_skip_on_any_host() -> None:
    run = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--sections", "nvml", "--params", "1000"],
        cwd=ROOT,
        env={**gpu_check.child_env(), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert (document["cuda"], document["ok"], document["params"]) == (False, False, 1000)
    assert "no CUDA" in document["skipped"]


def test_parse_smi_reads_a_line_per_gpu_with_na_and_commas_in_names() -> None:
    text = f"{H100}\n1, GPU-abc, NVIDIA A100, PCIe, 40960, [N/A], [Not Supported]\n\n"
    assert parse_smi(text) == [
        SmiGpu(0, "GPU-5e8f3c2a-1b2c-4d5e-8f90-0123456789ab", "NVIDIA H100 80GB HBM3",
               81559.0, 34.0, 71.25),
        SmiGpu(1, "GPU-abc", "NVIDIA A100, PCIe", 40960.0, None, None),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="is not index, uuid, name"):
        parse_smi("No devices were found")


def _shoal(**changes: Any) -> dict[str, Any]:
    gpu = {
        "index": 0,
        "uuid": "GPU-5e8f3c2a-1b2c-4d5e-8f90-0123456789ab",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mb": 81559.0,
        "temperature_c": 36.0,
    }
    return gpu | changes


def test_compare_nvml_agrees_within_tolerances_and_names_each_difference() -> None:
    smi = parse_smi(H100)
    assert compare_nvml(smi, [_shoal()]) == []
    assert compare_nvml(smi, [_shoal(uuid="GPU-other", temperature_c=45.0)]) == [
        "GPU 0: uuid 'GPU-other' != 'GPU-5e8f3c2a-1b2c-4d5e-8f90-0123456789ab'",
        "GPU 0: temperature_c 45 (shoal) != 34 (nvidia-smi)",
    ]
    assert compare_nvml(smi, [_shoal(memory_total_mb=None)]) == [
        "GPU 0: shoal has no memory_total_mib (nvidia-smi: 81559)"
    ]
    assert compare_nvml(smi, []) == [
        "nvidia-smi shows 1 GPUs, shoal 0",
        "GPU 0: shoal does not show it",
    ]


def _rank(rank: int, world_size: int = 2, **changes: Any) -> dict[str, Any]:
    value = world_size * (world_size + 1) / 2
    fields = {"rank": rank, "world_size": world_size, "backend": "nccl", "value": value}
    return fields | {"gpu_uuid": f"GPU-{rank}"} | changes


def test_judge_group_wants_every_rank_on_nccl_its_own_gpu_and_the_sum() -> None:
    assert judge_group([_rank(0), _rank(1)], 2) == []
    assert judge_group([_rank(0)], 2) == ["ranks [0] reported, expected 0..1"]
    assert judge_group([_rank(0), _rank(1, gpu_uuid="GPU-0")], 2) == [
        "two ranks share a GPU: ['GPU-0', 'GPU-0']"
    ]
    assert judge_group([_rank(0, backend="gloo", value=1.0), _rank(1)], 2) == [
        "rank 0: backend 'gloo', not nccl",
        "rank 0: all_reduce gave 1.0, not 3.0",
    ]
    failed = {"rank": None, "error": "RuntimeError: Duplicate GPU detected"}
    assert judge_group([_rank(0), failed], 2) == [
        "rank None: RuntimeError: Duplicate GPU detected",
        "ranks [0] reported, expected 0..1",
    ]


def test_a_generation_counts_once_every_rank_of_the_whole_world_reported() -> None:
    half = [_rank(0, 1, generation=1)]  # one node planned alone before the other joined
    assert complete_generation(half, 2) is None
    first = [_rank(0, generation=2)]
    assert complete_generation([*half, *first], 2) is None
    full = [*half, *first, _rank(1, generation=2)]
    assert complete_generation(full, 2) == [_rank(0, generation=2), _rank(1, generation=2)]
    newer = [*full, _rank(0, generation=3), _rank(1, generation=3, error="NCCL error")]
    assert complete_generation(newer, 2) == newer[-2:]
    unjoined = {"rank": None, "generation": None, "error": "TypeError: join_group"}
    assert complete_generation([*first, unjoined], 2) == [unjoined]


def test_the_tests_section_runs_the_modules_that_mark_gpu_tests() -> None:
    files = gpu_test_files(ROOT / "tests")
    assert ROOT / "tests" / "node" / "test_groups.py" in files
    assert ROOT / "tests" / "node" / "test_daemon.py" not in files


def test_digests_compare_as_text_or_as_tensors() -> None:
    torch = pytest.importorskip("torch")
    assert same_digest("ab12", "ab12")
    assert not same_digest("ab12", "ab13")
    assert same_digest(torch.tensor([1, 2]), torch.tensor([1, 2]))
    assert not same_digest(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert not same_digest(torch.tensor([1, 2]), "12")


def test_split_gpus_gives_two_disjoint_halves() -> None:
    assert split_gpus(2) == ((0,), (1,))
    assert split_gpus(8) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert split_gpus(3) == ((0, 1), (2,))


def test_pytest_summary_and_the_last_json_line() -> None:
    output = "....s\n=== short test summary ===\n4 passed, 1 skipped, 2 errors in 3.2s\n"
    assert parse_pytest_summary(output) == {"passed": 4, "skipped": 1, "errors": 2}
    assert parse_pytest_summary("no tests ran") == {}
    assert last_json_line('{"a": 1}\nnoise\n{"ok": true}\ntrailing') == {"ok": True}
    assert last_json_line("[1]\n{broken") is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_failing_section_never_stops_the_others_and_each_keeps_to_its_budget() -> None:
    clock = FakeClock()
    given: dict[str, float] = {}

    def runner(name: str, timeout_s: float) -> dict[str, Any]:
        given[name] = timeout_s
        if name == "group":
            raise RuntimeError("daemon gpu-1 exited 2")
        clock.now += {"nvml": 2.0, "split": 70.0}.get(name, 1.0)
        return {"ok": name != "split", "figure": 1}

    results = run_sections(["nvml", "group", "split", "digest", "tests"], runner, 100.0, clock)
    assert results["group"]["ok"] is False
    assert results["group"]["error"] == "RuntimeError: daemon gpu-1 exited 2"
    assert (results["nvml"]["ok"], results["nvml"]["error"], results["nvml"]["seconds"]) == (
        True,
        None,
        2.0,
    )
    assert results["split"]["ok"] is False
    assert given == {"nvml": 30.0, "group": 60.0, "split": 75.0, "digest": 28.0, "tests": 27.0}
    assert results["tests"]["ok"] is True

    clock.now = 0.0
    starved = run_sections(["split", "tests"], runner, 72.0, clock)
    assert starved["tests"] == {
        "ok": False,
        "error": "not run: 2 s left of --timeout-s 72",
    }


def test_the_faults_section_reads_and_self_tests_through_the_watchers_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here through the fake-GPU seam (on a GPU host, NVML): a healthy host is ok; an Xid 79
    is the section's fault, named as plans name it, and a failing self-test its error."""
    from health import ENV_FAKE_GPUS, FakeGpu, write_fake_gpus

    seam = tmp_path / "gpus.json"
    uuids = [f"GPU-5d8f0e1{i}-2a3b-4c5d-6e7f-0123456789ab" for i in range(2)]
    write_fake_gpus(seam, [FakeGpu(uuid=uuid) for uuid in uuids])
    monkeypatch.setenv(ENV_FAKE_GPUS, str(seam))
    args = gpu_check.parse_args(["--child", "faults", "--timeout-s", "30"])
    healthy = gpu_check.section_faults(args)
    assert (healthy["ok"], healthy["gpus"], healthy["faults"]) == (True, 2, [])
    assert (healthy["selftest"]["passed"], healthy["selftest"]["method"]) == (True, "fake")
    assert healthy["read_s"] >= 0
    write_fake_gpus(
        seam, [FakeGpu(uuid=uuids[0]), FakeGpu(uuid=uuids[1], xids=(79,), selftest="fail")]
    )
    faulty = gpu_check.section_faults(args)
    assert faulty["ok"] is False
    assert faulty["faults"] == ["gpu_fault: Xid 79 on GPU-5d8f0e11-2a"]
    assert "self-test failed: failed: " + uuids[1] in faulty["error"]
    assert json.loads(json.dumps(faulty))["samples"][1]["xids"] == [79]  # the document is JSON


def test_the_training_section_wants_a_hang_restart_in_time_and_every_rank_back_on_nccl() -> None:
    back = [{"rank": 0, "backend": "nccl"}, {"rank": 1, "backend": "nccl"}]
    restart = {"at": 112.0, "reason": "hang", "generation": 3}
    assert training_verdict(2, restart, 100.0, 10.0, back, True) == []
    late = {**restart, "at": 115.5}
    assert training_verdict(2, late, 100.0, 10.0, back, True) == [
        "the restart came 15.5 s after the stop"
    ]
    assert training_verdict(2, None, 100.0, 10.0, back[:1], False) == [
        "no restart with reason hang",
        "the stopped worker was not ended",
        "1 of 2 ranks stepped again",
    ]
    gloo = [{"rank": 0, "backend": "gloo"}]
    assert training_verdict(1, restart, 100.0, 10.0, gloo, True) == [
        "a rank of the new generation is not on nccl"
    ]
