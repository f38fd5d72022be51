"""Item 13: a gossip key removed from the keyring must not open datagrams at any member, even
though every member opened datagrams sealed with it (and so built its cipher) just before: a
ring that kept the old ring's cipher cache would still open them."""

from __future__ import annotations

import random
from pathlib import Path

from node.membership.envelope import Drop, Envelope
from node.membership.keyring import key_id, new_key
from node.membership.service import InMemoryNetwork, Membership
from tests.node.membership_sim import FAST, PORT, host, wait_for
from tests.node.test_membership_keyring import SECRET, _keys

NOW = 1_700_000_000.0


async def test_removed_gossip_key_opens_nothing_at_any_member(tmp_path: Path) -> None:
    network = InMemoryNetwork(random.Random(7), delay_s=0.0005, jitter_s=0.0005)
    k1, k2 = new_key(), new_key()
    names = ["m0", "m1", "m2"]
    keys = {name: _keys(tmp_path, name, k1) for name in [*names, "old"]}
    nodes: dict[str, Membership] = {}

    async def start(index: int, name: str) -> Membership:
        endpoint = network.endpoint(host(index), PORT, secret=SECRET, keys=keys[name])
        member = Membership(name, host(index), PORT, {}, endpoint, FAST, rng=random.Random(index))
        await member.start()
        if index:
            member.add_candidate(host(0), PORT)
        nodes[name] = member
        return member

    try:
        for index, name in enumerate(names):
            await start(index, name)
        await wait_for(
            lambda: all(n.counts()["alive"] == len(names) for n in nodes.values()),
            what="three alive, every one opening k1",
        )
        sealed = Envelope("lab", SECRET, keys=keys["old"])  # the in-memory network's cluster
        for name in names:
            assert keys[name].ring.cipher(key_id(k1)) is not None  # built by the traffic
            keys[name].install(k2)
            keys[name].use(key_id(k2))
        for name in names:
            # members that use k2 still open k1 from those that have not switched yet (here:
            # a datagram sealed with k1, opened just before the removal)
            channel = Envelope("lab", SECRET, keys=keys[name])
            assert channel.open(sealed.seal(b"{}", NOW, boot=2, seq=1), NOW).drop is None
            keys[name].remove(key_id(k1))
        for name in names:
            assert keys[name].ring.cipher(key_id(k1)) is None, f"{name} still opens k1"
            channel = Envelope("lab", SECRET, keys=keys[name])
            opened = channel.open(sealed.seal(b"{}", NOW, boot=1, seq=1), NOW)
            assert opened.drop == Drop.UNKNOWN_KEY, (name, opened.drop)
        # a member still sealing with k1 is refused at every member
        late = await start(len(names), "old")
        for name in names:
            late.add_candidate(host(names.index(name)), PORT)
        await wait_for(
            lambda: all(
                nodes[name].transport_stats().dropped.get("unknown_key", 0) > 0 for name in names
            ),
            timeout_s=15,
            what="every member to drop datagrams sealed with the removed key",
        )
        assert all(nodes[name].member("old") is None for name in names)
    finally:
        for node in nodes.values():
            await node.close()
        network.close()
