"""examples/train.py (the script of the tour and of bench/goodput_bench.py) saves through
`session.save` and resumes through `session.restore`: run under torchrun's environment with no
daemon, a second run resumes from the step the first one saved last, and writes the progress
lines the bench scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.cluster.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train.py"


def run_example(tmp_path: Path, steps: int) -> list[dict[str, Any]]:
    progress = tmp_path / "progress"
    progress.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "SHOAL_BACKEND": "gloo",
        "SHOAL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("SHOAL_DAEMON_URL", None)
    argv = [
        sys.executable, str(SCRIPT),
        "--steps", str(steps), "--step-s", "0.01", "--save-s", "0.05", "--width", "16",
        "--progress", str(progress), "--name", "n1",
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"done at step {steps}" in done.stdout
    lines = []
    for path in sorted(progress.glob("*.jsonl")):
        lines += [json.loads(text) for text in path.read_text().splitlines()]
    return lines


def test_the_example_saves_and_a_second_run_resumes_from_the_last_saved_step(
    tmp_path: Path,
) -> None:
    first = run_example(tmp_path, 12)
    restored = [line for line in first if line["event"] == "restored"]
    assert [(line["step"], line["rank"], line["world"]) for line in restored] == [(0, 0, 1)]
    assert [line["step"] for line in first if line["event"] == "step"] == list(range(1, 13))
    assert [line["step"] for line in first if line["event"] == "saved"] == [5, 10]

    second = run_example(tmp_path, 15)
    resumed = [line for line in second if line["event"] == "restored" and line not in first]
    # the last save (step 12, blocking, at the end of the first run) is where it resumes
    assert [line["step"] for line in resumed] == [12]
    steps = [line["step"] for line in second if line["event"] == "step" and line not in first]
    assert steps == [13, 14, 15]
