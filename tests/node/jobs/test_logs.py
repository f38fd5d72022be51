"""Job logs over HTTP: offsets, tail, the per-job cap, and a followed log that survives 100
random disconnects byte for byte."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import aiohttp

from tests.node.jobs.helpers import job_daemon

WRITER = (
    "import sys, time\n"
    "for i in range(6000):\n"
    "    sys.stdout.write(f'{i:06d} ' + 'x' * (i % 97) + '\\n')\n"
    "    if i % 50 == 0:\n"
    "        sys.stdout.flush(); time.sleep(0.01)\n"
)


def expected_writer_output() -> bytes:
    return b"".join(f"{i:06d} {'x' * (i % 97)}\n".encode() for i in range(6000))


async def test_offsets_tail_and_next_offset(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.start(["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; done"])
        await client.wait(job["job_id"])
        url = f"{client.base}/v1/jobs/{job['job_id']}/logs"
        async with client.session.get(url) as response:
            whole = await response.read()
            assert whole == b"".join(f"{i}\n".encode() for i in range(1, 11))
            assert response.headers["X-Next-Offset"] == str(len(whole))
            assert response.headers["X-Start-Offset"] == "0"
        async with client.session.get(url, params={"offset": "4"}) as response:
            assert await response.read() == whole[4:]
            assert response.headers["X-Next-Offset"] == str(len(whole))
        async with client.session.get(url, params={"offset": str(len(whole))}) as response:
            assert await response.read() == b""
        async with client.session.get(url, params={"tail": "3"}) as response:
            assert await response.read() == b"8\n9\n10\n"
            assert int(response.headers["X-Start-Offset"]) == len(whole) - len(b"8\n9\n10\n")
        async with client.session.get(url, params={"tail": "50"}) as response:
            assert await response.read() == whole
        async with client.session.get(url, params={"stream": "nope"}) as response:
            assert response.status == 400


async def test_the_log_cap_keeps_the_first_bytes_and_says_so(tmp_path: Path) -> None:
    async with job_daemon(tmp_path, {"jobs.max_log_bytes": 1000}) as client:
        script = "import sys; sys.stdout.write('a' * 5000); sys.stderr.write('b' * 10)"
        job = await client.wait((await client.start([sys.executable, "-c", script]))["job_id"])
        assert job["state"] == "succeeded"
        assert job["log_bytes"] == {"stdout": 1000, "stderr": 10}
        assert job["log_capped"] == {"stdout": True, "stderr": False}
        assert job["max_log_bytes"] == 1000
        assert await client.log(job["job_id"]) == b"a" * 1000


async def test_follow_resumed_by_offset_after_100_random_disconnects(tmp_path: Path) -> None:
    rng = random.Random(1313)
    async with job_daemon(tmp_path) as client:
        job = await client.start([sys.executable, "-c", WRITER])
        url = f"{client.base}/v1/jobs/{job['job_id']}/logs"
        received = bytearray()
        disconnects = 0
        finished = False
        while not finished:
            params = {"follow": "1", "offset": str(len(received))}
            async with client.session.get(url, params=params) as response:
                assert response.status == 200
                assert int(response.headers["X-Start-Offset"]) == len(received)
                assert int(response.headers["X-Next-Offset"]) == len(received)
                if disconnects < 100:
                    chunk = await response.content.read(rng.randint(1, 700))
                    received += chunk
                    disconnects += 1
                    response.close()  # drop the connection mid-stream
                else:
                    received += await response.read()
                    finished = True
        assert disconnects == 100
        assert bytes(received) == expected_writer_output()
        assert (await client.wait(job["job_id"]))["state"] == "succeeded"


async def test_follow_streams_until_the_job_ends(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.start(["sh", "-c", "echo one; sleep 0.3; echo two"])
        url = f"{client.base}/v1/jobs/{job['job_id']}/logs"
        timeout = aiohttp.ClientTimeout(total=30)
        async with client.session.get(url, params={"follow": "1"}, timeout=timeout) as response:
            assert await response.read() == b"one\ntwo\n"
