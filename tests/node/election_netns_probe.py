"""Watch shoal daemons' election from a harness host: one JSON line per answer.

usage: election_netns_probe.py --secret-file FILE [--interval-s S] [--timeout-s S] ADDRESS:PORT ...

Each target is polled on its own (a hung daemon does not slow the others): a signed GET /v1/plan
every interval, printing `{"t": MONOTONIC, "target": "ADDRESS:PORT", "node", "term",
"coordinator", "lease_valid", "plan": [TERM, VERSION] | null, "ranks": [NODE, ...] | null,
"nodes": [NODE, ...] | null}` (`nodes`: every node the plan gives a role), or `"error"` instead
when it did not answer. `t` is time.monotonic()
when the answer arrived (one clock for every process of the machine). Runs until killed.
"""

from __future__ import annotations

import sys
from typing import Any

from tests.node.netns_probe import run_probe

PLAN_PATH = "/v1/plan"


def _fields(document: dict[str, Any]) -> dict[str, object]:
    plan = document.get("plan")
    return {
        "node": document["node"],
        "term": document["term"],
        "coordinator": document["coordinator"],
        "lease_valid": document["lease_valid"],
        "plan": None if plan is None else [plan["term"], plan["version"]],
        "ranks": None if plan is None else plan["training_ranks"],
        "nodes": None if plan is None else sorted(plan["roles"]),
    }


def main(argv: list[str]) -> int:
    return run_probe(argv, __doc__.splitlines()[0], PLAN_PATH, _fields, 0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
