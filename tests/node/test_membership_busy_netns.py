"""A node that is busy is not dead, across real hosts: three `shoal serve` daemons in network
namespaces with the default (fast) membership timing. The first host's link is limited to
20 Mbit/s with `tc` and saturated both ways by the background sync: its peers pull its
checkpoint, it pulls the third host's, and a second of FIFO queue at the switch's port toward it
makes datagrams to it wait behind the bulk. No live member is ever declared dead, and the busy
member, SIGKILLed while its link is still full, is dead at both peers. The saturation lasts
20 s here (bench/membership_netns.py --busy-s 60 runs the minute); the link limit and every
namespace are removed even when the test fails.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from config.timeouts import Timeouts
from tests.cluster import NetnsClusterFactory
from tests.node.netns_busy import run_busy

pytestmark = pytest.mark.netns
RecordProperty = Callable[[str, object], None]

SATURATE_S = 20.0
MIN_UTILISATION = 0.8
"""The link must really have been full: otherwise the test proves nothing."""
MAX_SUSPICIONS = SATURATE_S / 2
"""Suspicions a daemon may raise in the saturation (each refuted): a probe whose acks wait a
second behind the bulk still ends acked when the member's own messages arrive meanwhile, so
few probes fail (about 30 per daemon fail without that rule, one per probe of the member)."""
DEAD_S = 3 * Timeouts().detection_s
"""Liveness bound from the SIGKILL to dead at both peers: the worst case of the timing (probe,
indirect probe, unconfirmed suspicion) three times over, for a loaded shared machine; the
bench measures the time itself."""


@pytest.mark.timeout(240)
def test_a_member_saturating_its_link_is_never_dead_and_dies_when_killed(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    report = run_busy(netns_cluster(4), SATURATE_S)
    summary = report.to_dict()
    record_property("busy_member", summary)
    print(summary)
    assert min(report.utilisation) >= MIN_UTILISATION, summary
    assert report.false_deaths == 0, summary
    assert all(e.get("suspect", 0) <= MAX_SUSPICIONS for e in report.events.values()), summary
    assert not report.seen_dead, summary
    assert set(report.kill_to_dead_s) == {"h1", "h2"}, summary
    assert max(report.kill_to_dead_s.values()) <= DEAD_S, summary
