"""The pipeline-RL example behind `shoal rl demo`: a trainer and generators on a toy task that
learns (a contextual bandit: 4 contexts, 4 actions, reward 1 for the right action).

Generators sample with the newest weights they hold, stamp every sample with its policy version
and post it to their node's `rollouts` store; the trainer reads fresh samples from every node,
takes one REINFORCE step per batch and publishes the new weights in flight.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node.errors import PeerRequestError, PublishTimeout, WeightsError
from node.rl.publisher import WeightPublisher
from node.rl.receiver import WeightReceiver
from node.rl.stream import RolloutStream, post_rollouts, rollout_record
from node.rl.versions import make_version_state, set_version, stamp_sample

CONTEXTS = ACTIONS = 4
EPISODES_PER_POST = 16


def make_policy() -> Any:
    """A linear policy over one-hot contexts; zero weights: every node starts uniform."""
    import torch

    policy = torch.nn.Linear(CONTEXTS, ACTIONS)
    torch.nn.init.zeros_(policy.weight)
    torch.nn.init.zeros_(policy.bias)
    return policy


def reward(context: int, action: int) -> float:
    return 1.0 if action == (3 * context + 1) % ACTIONS else 0.0


def run_generator(
    run: str, daemon_url: str, models_dir: Path, max_lag: int, stop: threading.Event
) -> None:
    """One generator node: a receiver thread keeps the weights fresh; this loop samples."""
    import torch

    policy, lock = make_policy(), threading.Lock()
    receiver = WeightReceiver(run, daemon_url, models_dir=models_dir)
    receiver.catch_up(policy)  # a late or restarted generator starts from the newest file
    state = make_version_state(receiver.node, max(0, receiver.version))

    def pause() -> None:
        lock.acquire()

    def receive_forever() -> None:
        while not stop.is_set():
            try:  # generation pauses (takes the lock) only while the broadcast lands
                receiver.receive_into(policy, pause=pause, resume=lock.release, timeout_s=2)
            except WeightsError:
                continue  # left out of one version; the next one (or the file) catches up

    threading.Thread(target=receive_forever, daemon=True).start()
    rng = random.Random()
    while not stop.is_set():
        try:
            receiver.wait_fresh(max_lag, timeout_s=5)  # backpressure: never run too stale
        except WeightsError:
            continue
        samples = []
        with lock, torch.no_grad():
            set_version(state, max(state["version"], receiver.version))
            for _ in range(EPISODES_PER_POST):
                context = rng.randrange(CONTEXTS)
                probs = torch.softmax(policy(torch.eye(CONTEXTS)[context]), -1)
                action = int(torch.multinomial(probs, 1))
                sample = {"context": context, "action": action, "reward": reward(context, action)}
                samples.append(rollout_record(stamp_sample(sample, state), run))
        try:  # blocks while the store holds rollouts_max_pending unconsumed samples (429)
            post_rollouts(receiver.endpoint, samples, stop=stop)
        except WeightsError:
            break  # stopped while the store was full
        except PeerRequestError:
            time.sleep(0.2)  # the daemon is restarting: back off
        time.sleep(0.02)


def train(
    run: str,
    trainer_url: str,
    node_urls: Sequence[str],
    models_dir: Path,
    steps: int,
    max_lag: int,
    batch_size: int,
    on_step: Callable[[dict[str, Any]], None],
    before_step: Callable[[int], None] = lambda step: None,
) -> Any:
    """The trainer: read fresh rollouts, one REINFORCE step, publish; `on_step` gets the line."""
    import torch

    policy = make_policy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=2.0)
    stream = RolloutStream(run, max_lag=max_lag, batch_size=batch_size, nodes=node_urls)
    with WeightPublisher(run, trainer_url, models_dir=models_dir, deadline_s=5.0) as publisher:
        version = 0
        publisher.publish(policy, version)
        for step in range(1, steps + 1):
            before_step(step)
            batch = stream.next_batch(version, timeout_s=30)
            if not batch:
                raise WeightsError("no rollouts arrived in 30 s: are the generators running?")
            contexts = torch.eye(CONTEXTS)[[r["payload"]["context"] for r in batch]]
            actions = torch.tensor([r["payload"]["action"] for r in batch])
            rewards = torch.tensor([r["payload"]["reward"] for r in batch])
            logp = torch.log_softmax(policy(contexts), -1).gather(1, actions[:, None])[:, 0]
            loss = -((rewards - rewards.mean()) * logp).mean()  # REINFORCE with a baseline
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            version += 1
            broadcast_ms: float | None = None
            try:
                result = publisher.publish(policy, version)
                broadcast_ms = round(result.broadcast_s * 1000, 1)
            except PublishTimeout as exc:  # a generator died mid-broadcast: named, not hung
                on_step({"step": step, "version": version, "left_out": list(exc.receivers)})
            on_step(
                {
                    "step": step,
                    "version": version,
                    "samples": len(batch),
                    "dropped_stale": stream.dropped_stale,
                    "max_lag_seen": stream.max_lag_seen,
                    "reward_mean": round(float(rewards.mean()), 3),
                    "broadcast_ms": broadcast_ms,
                }
            )
    return version
