"""The publisher's calls to the receivers' daemons around a broadcast: the offer of a version
(POST /v1/weights/update) and the wait for each one's acknowledgement (its weights status),
each receiver asked at the same time as the others."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from node.errors import PeerRequestError
from node.rl.client import call, post_digested
from node.rl.digest import Digest
from node.training.rendezvous import DaemonEndpoint

log = logging.getLogger(__name__)

ACK_POLL_S = 0.005


def offer_update(
    endpoint: DaemonEndpoint,
    urls: Mapping[str, str],
    body: Mapping[str, Any],
    digest: Digest,
    headers: Mapping[str, str],
    timeout_s: float,
    pool: Executor,
) -> list[str]:
    """POST the offer `body` with `digest` to every receiver's daemon in `urls` at once; the
    receivers whose daemon accepted, in the order of `urls`."""

    def offer(node: str) -> bool:
        try:
            post_digested(
                endpoint,
                "/v1/weights/update",
                body,
                digest,
                url=urls[node],
                timeout_s=timeout_s,
                headers=headers,
            )
        except PeerRequestError as exc:
            log.warning(
                "run %s version %s: %s refused the offer: %s",
                body.get("run"),
                body.get("version"),
                node,
                exc,
            )
            return False
        return True

    answers = {node: pool.submit(offer, node) for node in urls}
    return [node for node, answer in answers.items() if answer.result()]


def wait_acknowledged(
    endpoint: DaemonEndpoint,
    urls: Mapping[str, str],
    run: str,
    version: int,
    digest: Digest,
    ready: Sequence[str],
    left_s: Callable[[], float],
    pool: Executor,
) -> tuple[str, ...]:
    """The `ready` receivers whose daemon shows `version` with `digest` applied (or a newer
    version) before `left_s()` reaches 0, sorted; every receiver not acknowledged yet is
    asked at once, again every ACK_POLL_S."""
    path = f"/v1/weights/status?run={run}"

    def acknowledged(node: str) -> bool:
        try:
            _, status = call(
                endpoint, "GET", path, url=urls[node], timeout_s=min(1.0, max(0.05, left_s()))
            )
        except PeerRequestError:
            return False
        if not isinstance(status, dict) or status.get("version", -1) < version:
            return False
        return status.get("version") != version or Digest.of_message(status) == digest

    acked: set[str] = set()
    while True:
        asked = {node: pool.submit(acknowledged, node) for node in ready if node not in acked}
        acked.update(node for node, answer in asked.items() if answer.result())
        if len(acked) == len(ready) or left_s() <= 0:
            return tuple(sorted(acked))
        time.sleep(ACK_POLL_S)
