"""The documentation of the run routes (POST/GET /v1/runs, GET /v1/runs/{id}, POST
/v1/runs/{id}/cancel) and of the results fetch (POST /v1/results/fetch)."""

from __future__ import annotations

from node.openapi import RouteDoc
from node.runs.fetch import FetchBody
from node.runs.queue import CancelBody, RunBody, RunList, RunRecord
from node.runs.results import FETCH_PATH

RUNS_PATH = "/v1/runs"


def run_route_docs() -> list[RouteDoc]:
    """The documentation of the run routes and of the results fetch."""
    common = ((503, "no coordinator or no quorum"),)
    return [
        RouteDoc(
            "POST",
            RUNS_PATH,
            'Queue a run {"argv", "group", "nodes", "role", "stack", '
            '"keep_alive", "max_duration_s", "results", "name"}; answers its record',
            ((201, "queued"), (400, "bad run"), (429, "the group's queue is full"), *common),
            body=RunBody,
            response=RunRecord,
        ),
        RouteDoc(
            "GET",
            RUNS_PATH,
            "Every run (?group=G), oldest first",
            ((200, "runs"), *common),
            response=RunList,
        ),
        RouteDoc(
            "GET",
            f"{RUNS_PATH}/{{run_id}}",
            "One run's record: state, step, log, results",
            ((200, "the run"), (404, "no such run"), *common),
            parameters=(("run_id", "path", "the run's id", {"type": "string"}),),
            response=RunRecord,
        ),
        RouteDoc(
            "POST",
            f"{RUNS_PATH}/{{run_id}}/cancel",
            "Cancel: a queued run is removed, a running one killed (results still collected)",
            (
                (200, "cancelled"),
                (400, "a body other than {}"),
                (404, "no such run"),
                (409, "already ended"),
                *common,
            ),
            parameters=(("run_id", "path", "the run's id", {"type": "string"}),),
            body=CancelBody,
            body_optional=True,
            response=RunRecord,
        ),
        RouteDoc(
            "POST",
            FETCH_PATH,
            'The results node only: fetch {"key", "node", "job_id", "path"} from that member '
            "node's job and store it at key (answers once stored, hash checked)",
            (
                (200, "stored, or missing on the member"),
                (400, "bad request"),
                (409, "this node is not results.node"),
                (502, "the member could not be read"),
                (503, "the member is not in this node's view"),
            ),
            body=FetchBody,
        ),
    ]
