"""The weights plane of a running daemon: the WeightsService with how it reaches members and
reads the plan, its group served at /v1/rendezvous?group=weights, made in one place so the
daemon adds it with one call."""

from __future__ import annotations

from net import peer_url
from node.election.service import ElectionService
from node.membership.service import Membership
from node.rl.routes import WeightsRoutes
from node.rl.service import WeightsService
from node.runtime import NodeRuntime


def weights_service(runtime: NodeRuntime, election: ElectionService) -> WeightsService:
    """The pipeline-RL weights plane of this node; its group is served at
    /v1/rendezvous?group=weights (the election's group handlers)."""

    def url_of(node_id: str) -> str | None:
        if node_id == runtime.node_id:
            return peer_url(runtime.address, runtime.port)
        membership = runtime.membership
        member = membership.member(node_id) if isinstance(membership, Membership) else None
        return None if member is None else peer_url(member.address, member.port)

    weights = WeightsService(
        runtime.node_id,
        lambda: election.elector.plan if election.elector is not None else None,
        url_of,
        runtime.wal,
        runtime.metrics.registry if runtime.metrics is not None else None,
    )
    election.group_handlers["weights"] = WeightsRoutes(weights).rendezvous
    return weights
