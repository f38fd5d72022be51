"""Jobs see the GPUs their node owns: CUDA_VISIBLE_DEVICES when `gpus` lists them, never over
a job's own choice (the GPUs come from the SHOAL_TEST_FAKE_GPUS seam)."""

from __future__ import annotations

from pathlib import Path

import pytest

from health import ENV_FAKE_GPUS, BreakerRegistry
from node.jobs.component import jobs_base_env
from node.runtime import NodeRuntime
from tests.node.daemons import test_settings
from tests.node.jobs.helpers import job_daemon

PRINT_GPUS = ["sh", "-c", 'echo "${CUDA_VISIBLE_DEVICES-unset} ${CUDA_DEVICE_ORDER-unset}"']


async def test_a_job_sees_the_listed_gpus_unless_it_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FAKE_GPUS, "GPU-j0,GPU-j1,GPU-j2,GPU-j3")
    async with job_daemon(tmp_path, {"gpus": [3, 1]}) as client:
        plain = await client.start(PRINT_GPUS)
        own = await client.start(PRINT_GPUS, env={"CUDA_VISIBLE_DEVICES": "0"})
        for job in (plain, own):
            assert (await client.wait(job["job_id"]))["exit_code"] == 0
        assert await client.log(plain["job_id"]) == b"3,1 PCI_BUS_ID\n"
        assert (await client.log(own["job_id"])).startswith(b"0 ")


@pytest.mark.parametrize(("gpus", "owned"), [("auto", (0, 1)), ("none", ())])
def test_auto_and_none_leave_the_daemon_environment_alone(
    tmp_path: Path, gpus: str, owned: tuple[int, ...]
) -> None:
    settings = test_settings(tmp_path, "n", gpus=gpus)
    runtime = NodeRuntime(settings, "n", "127.0.0.1", "0", BreakerRegistry(), owned_gpus=owned)
    environ = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "5"}
    assert jobs_base_env(runtime, environ) == environ
    listed = NodeRuntime(
        test_settings(tmp_path, "m", gpus=[1]), "m", "127.0.0.1", "0", BreakerRegistry()
    )
    listed.owned_gpus = (1,)
    assert jobs_base_env(listed, environ)["CUDA_VISIBLE_DEVICES"] == "1"
