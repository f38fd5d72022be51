"""The previous release reads a heartbeat of this one that names where to fetch the plan
instead of carrying it (node.election.spread): its route model and parser accept the new keys
and keep the fence, so it answers with its own fence and is sent the plan whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from node.election.messages import Heartbeat
from node.plan import PlanFence
from tests.compat.previous import previous_tree

READ = """
import json, sys
from node.election.messages import Heartbeat
try:
    from node.election.routes import HeartbeatBody
except ImportError:  # the release before node/election/routes.py named it http.py
    from node.election.http import HeartbeatBody
data = json.loads(sys.stdin.read())
HeartbeatBody.model_validate(data)
beat = Heartbeat.from_dict(data)
print(json.dumps([beat.plan_fence.to_list(), beat.plan is None]))
"""


def test_the_previous_release_reads_a_heartbeat_naming_plan_sources() -> None:
    beat = Heartbeat(4, "c", 9, PlanFence(4, 2), None, "0123456789abcdef", ("p1", "p2"))
    assert {"plan_digest", "plan_sources"} <= set(beat.to_dict())
    with previous_tree() as tree:
        env = {**os.environ, "PYTHONPATH": tree.pythonpath}
        done = subprocess.run(
            [sys.executable, "-c", READ],
            input=json.dumps(beat.to_dict()),
            capture_output=True,
            text=True,
            cwd=tree.root,
            env=env,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [[4, 2], True]
