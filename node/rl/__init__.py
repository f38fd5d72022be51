"""Pipeline RL: bucketed weight broadcast, policy versions on samples, the weights control
plane, publisher and receiver, rollout streams. torch is imported only where tensors are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.rl.backlog import RolloutBacklog
    from node.rl.broadcast import broadcast_weights, receive_weights
    from node.rl.digest import (
        PWS_ALGO,
        SHA256_ALGO,
        Digest,
        HostStaging,
        WeightsDigest,
        weights_digest,
    )
    from node.rl.published import PublishResult
    from node.rl.publisher import WeightPublisher
    from node.rl.receiver import WeightReceiver
    from node.rl.service import WeightsService
    from node.rl.stream import (
        RolloutRecord,
        RolloutStream,
        post_rollouts,
        rollout_from_json,
        rollout_record,
    )
    from node.rl.versions import check_staleness, make_version_state, stamp_sample
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
