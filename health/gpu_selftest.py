"""The self-test a quarantined node's GPUs pass before the node asks to train again: every owned
GPU readable through NVML, then DCGM's quick diagnostic (`dcgmi diag -r 1`) where DCGM is
installed, else a small matmul on each GPU, in a child process, checked against the CPU's. The
fake-GPU seam's `selftest` field stands in for both in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from health.gpu_faults import FaultSample

__all__ = ["MATMUL_SCRIPT", "SelfTestResult", "run_selftest"]

OUTPUT_CHARS = 300
"""At most this much of a failed test's output goes into its detail."""

MATMUL_SCRIPT = """
import json, sys
try:
    import torch
except ImportError as exc:
    print(json.dumps({"skipped": f"torch is not installed ({exc})"}))
    sys.exit(0)
if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
    print(json.dumps({"error": "CUDA sees no GPU"}))
    sys.exit(1)
torch.backends.cuda.matmul.allow_tf32 = False
gen = torch.Generator().manual_seed(0)
a = torch.randn(512, 512, generator=gen)
b = torch.randn(512, 512, generator=gen)
want = a @ b
bound = 1e-3 * float(want.abs().max())
worst = []
for device in range(torch.cuda.device_count()):
    got = (a.to(f"cuda:{device}") @ b.to(f"cuda:{device}")).cpu()
    worst.append(float((got - want).abs().max()))
bad = [d for d, err in enumerate(worst) if not err <= bound]
print(json.dumps({"max_abs_err": worst, "bound": bound, "bad": bad}))
sys.exit(1 if bad else 0)
"""
"""The child's program: the same 512x512 float32 product on every visible GPU and on the CPU;
it fails when a GPU's result differs by more than 1e-3 of the largest entry (or it has none)."""


@dataclass(frozen=True)
class SelfTestResult:
    """How a self-test ended: `method` is fake, nvml, dcgmi or matmul (the last one run)."""

    passed: bool
    method: str
    detail: str
    duration_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "method": self.method,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
        }


async def run_selftest(
    samples: Sequence[FaultSample],
    timeout_s: float,
    *,
    dcgmi: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SelfTestResult:
    """Self-test the GPUs of `samples` (their latest fault reads). Fails when one is
    unreadable, when the fake seam says `fail`, when `dcgmi diag -r 1` fails (`dcgmi`: its
    path, default the one on PATH), or when the matmul differs from the CPU's; a test that runs
    past `timeout_s` fails. Without torch the matmul is skipped and NVML alone decides."""
    started = time.monotonic()

    def result(passed: bool, method: str, detail: str) -> SelfTestResult:
        return SelfTestResult(passed, method, detail, time.monotonic() - started)

    if not samples:
        return result(False, "nvml", "no GPU to test")
    for sample in samples:
        if sample.unreadable is not None:
            return result(False, "nvml", f"GPU {sample.index} unreadable: {sample.unreadable}")
    if any(sample.selftest is not None for sample in samples):
        failed = [sample.uuid for sample in samples if sample.selftest != "pass"]
        return result(not failed, "fake", f"failed: {', '.join(failed)}" if failed else "pass")
    program = dcgmi or shutil.which("dcgmi")
    if program is not None:
        ids = ",".join(str(sample.index) for sample in samples)
        code, output = await _run([program, "diag", "-r", "1", "-i", ids], env, timeout_s)
        return result(code == 0, "dcgmi", _tail(output) if code else "dcgmi diag -r 1 passed")
    child_env = {**(os.environ if env is None else env)}
    child_env["CUDA_VISIBLE_DEVICES"] = ",".join(sample.uuid for sample in samples)
    code, output = await _run([sys.executable, "-c", MATMUL_SCRIPT], child_env, timeout_s)
    try:
        answer = json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {}
    if code == 0 and isinstance(answer, dict) and "skipped" in answer:
        return result(True, "nvml", f"every GPU readable; matmul skipped: {answer['skipped']}")
    if code == 0:
        return result(True, "matmul", f"matmul matches the CPU on {len(samples)} GPUs")
    return result(False, "matmul", _tail(output) or f"the matmul child exited with {code}")


async def _run(argv: list[str], env: Mapping[str, str] | None, timeout_s: float) -> tuple[int, str]:
    """Run `argv` (its own session, so a kill takes its children too): its exit code and
    output; -1 and why when it cannot start or runs past `timeout_s` (it is killed)."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        return -1, f"cannot start {argv[0]}: {exc}"
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        return -1, f"{os.path.basename(argv[0])} did not end within {timeout_s:g} s"
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    code = process.returncode
    return (-1 if code is None else code), output.decode(errors="replace")


def _tail(output: str) -> str:
    return " ".join(output.split())[-OUTPUT_CHARS:]
