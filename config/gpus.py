"""Which of the host's GPUs a node owns and how many training processes it runs: the pure rules
behind the `gpus` and `training_nproc` settings, shared by the daemon, the launcher and dev-cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from config.errors import ConfigError

GpuSelection = Literal["auto", "none"] | tuple[int, ...]
"""The `gpus` setting: `auto` (every GPU NVML sees), `none`, or the owned indices."""
NprocSetting = Literal["auto"] | int
"""The `training_nproc` setting: `auto` (one per owned GPU, 1 without GPUs) or a count."""

ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"


def owned_gpus(selection: GpuSelection, visible: int) -> tuple[int, ...]:
    """The indices (NVML's order) this node owns among the `visible` GPUs of its host.

    ConfigError when the selection names a GPU the host does not have.
    """
    if selection == "auto":
        return tuple(range(visible))
    if selection == "none":
        return ()
    missing = [index for index in selection if index >= visible]
    if missing:
        raise ConfigError(
            f"gpus lists {', '.join(map(str, missing))} but this host has {visible} GPU(s) "
            f"(indices 0..{visible - 1}); fix `gpus` or set it to auto or none"
            if visible
            else f"gpus lists {', '.join(map(str, missing))} but NVML sees no GPU on this host; "
            "set `gpus: none` (or auto)"
        )
    return tuple(selection)


def training_nproc_for(setting: NprocSetting, owned: Sequence[int]) -> int:
    """Processes per node in the training group: one per owned GPU under `auto` (1 without
    GPUs); an explicit count may not exceed the owned GPUs (no two ranks on one GPU).
    """
    if setting == "auto":
        return max(1, len(owned))
    if owned and setting > len(owned):
        raise ConfigError(
            f"training_nproc is {setting} but this node owns {len(owned)} GPU(s) "
            f"({', '.join(map(str, owned))}); two ranks would share a GPU. Lower training_nproc "
            "or give the node more GPUs with `gpus`"
        )
    return setting


def cuda_visible_devices(owned: Sequence[int]) -> str | None:
    """The CUDA_VISIBLE_DEVICES value that shows a process exactly the `owned` GPUs, in order;
    None when the node owns none (leave the variable alone)."""
    if not owned:
        return None
    return ",".join(str(index) for index in owned)


def cuda_env(owned: Sequence[int]) -> dict[str, str]:
    """The environment that shows a process exactly the `owned` GPUs: CUDA_VISIBLE_DEVICES, and
    CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers the GPUs as NVML (and `gpus`) does; {} when
    the node owns none."""
    visible = cuda_visible_devices(owned)
    if visible is None:
        return {}
    return {ENV_CUDA_VISIBLE_DEVICES: visible, ENV_CUDA_DEVICE_ORDER: "PCI_BUS_ID"}


def restricts_gpus(selection: GpuSelection) -> bool:
    """Whether the daemon gives its jobs CUDA_VISIBLE_DEVICES: only for an explicit list (auto
    shows every GPU anyway, none owns nothing to show)."""
    return not isinstance(selection, str)


def gpu_share(node_index: int, nodes: int, visible: int) -> tuple[int, ...]:
    """The GPUs of node `node_index` of `nodes` sharing a host of `visible` GPUs, round-robin
    (node i gets i, i + nodes, i + 2 * nodes, ...); disjoint across the nodes, possibly empty."""
    if nodes < 1 or not 0 <= node_index < nodes or visible < 0:
        raise ConfigError(
            f"gpu_share needs 0 <= node_index ({node_index}) < nodes ({nodes}) and visible >= 0"
        )
    return tuple(range(node_index, visible, nodes))
