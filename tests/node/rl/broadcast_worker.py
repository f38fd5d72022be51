"""One rank of the 3-process broadcast test: rank 0 takes an optimizer step and broadcasts after
each; ranks 1 and 2 receive. Each rank prints one JSON line per round: version and the sha256 of
its raw parameter bytes (computed here, independently of node.rl)."""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from node.rl.broadcast import broadcast_weights, receive_weights


def raw_sha256(net: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for param in net.parameters():
        digest.update(bytes(param.detach().contiguous().view(torch.uint8).flatten().tolist()))
    return digest.hexdigest()


def main() -> None:
    rank, port, rounds, bucket_bytes = (int(arg) for arg in sys.argv[1:5])
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timeout=timedelta(seconds=60))
    group = dist.ProcessGroupGloo(dist.PrefixStore("w", store), rank, 3, timedelta(seconds=60))
    torch.manual_seed(1234)
    net = torch.nn.Sequential(  # the LayerNorm's two small tensors share a 300-byte bucket
        torch.nn.Linear(7, 33),
        torch.nn.LayerNorm(33),
        torch.nn.Tanh(),
        torch.nn.Linear(33, 3, dtype=torch.float64),
    )
    if rank != 0:
        torch.manual_seed(rank)  # receivers start from other weights: a no-op receive would show
        for param in net.parameters():
            torch.nn.init.normal_(param)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for version in range(1, rounds + 1):
        if rank == 0:
            out = net[0:3](torch.randn(16, 7))
            loss = net[3](out.double()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            broadcast_weights(net, group, version, bucket_bytes=bucket_bytes, timeout_s=60)
            got = version
        else:
            got = receive_weights(net, group, bucket_bytes=bucket_bytes, timeout_s=60)
        print(json.dumps({"rank": rank, "version": got, "sha": raw_sha256(net)}), flush=True)


if __name__ == "__main__":
    main()
