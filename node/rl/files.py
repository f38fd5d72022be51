"""Weights files under `models/<run>/`: written whole (temp name, fsync, rename, fsync of the
directory) by the publisher so the sync fan-out carries them; read by late receivers to catch up.
A file keeps the sha256 weights digest and, when the publish used another algo, that digest too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from node.errors import WeightsError
from node.rl.digest import SHA256_ALGO, Digest, digest_named

FILE_PATTERN = re.compile(r"^weights-v(\d{10})\.pt$")


def weights_path(models_dir: Path, run: str, version: int) -> Path:
    return models_dir / run / f"weights-v{version:010d}.pt"


def write_weights_file(
    models_dir: Path,
    run: str,
    version: int,
    model: Any,
    keep: int = 2,
    digest: Digest | None = None,
) -> Path:
    """Write `model`'s parameters at `version` with their sha256 weights digest (taken from
    `digest` when its algo is sha256, else computed here from the host copy) and `digest`
    when it is of another algo; keep the newest `keep` files of the run. The parameters must
    not change while it runs (CPU parameters are saved without a copy)."""
    import torch

    path = weights_path(models_dir, run, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: p.detach().cpu() for name, p in model.named_parameters()}  # the host copy
    if digest is not None and digest.algo == SHA256_ALGO:
        sha = digest.value
    else:
        sha = digest_named(state.items(), SHA256_ALGO).value
    document: dict[str, Any] = {"version": version, "sha256": sha, "params": state}
    if digest is not None and digest.algo != SHA256_ALGO:
        document["digest"] = digest.to_dict()
    temp = path.with_name(f".{path.name}.tmp")
    try:
        with temp.open("wb") as handle:
            torch.save(document, handle)
            handle.flush()
            os.fsync(handle.fileno())
        temp.replace(path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        raise WeightsError(f"cannot write weights file {path}: {exc}") from exc
    for old in weights_files(models_dir, run)[:-keep]:
        old[1].unlink(missing_ok=True)
    return path


def weights_files(models_dir: Path, run: str) -> list[tuple[int, Path]]:
    """(version, path) of the run's weights files, oldest first."""
    folder = models_dir / run
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := FILE_PATTERN.match(p.name))]
    return sorted(found)


def load_weights_file(path: Path, model: Any) -> tuple[int, Digest]:
    """Load a weights file into `model` in place; (version, its digest: the publish's, or the
    sha256 one for a file without). Both digests are checked on the CPU before `model` is
    touched; WeightsError when the file does not fit the model or a digest does not match."""
    import torch

    try:
        document = torch.load(path, map_location="cpu", weights_only=True)
        version, sha, params = document["version"], document["sha256"], document["params"]
        extra = document.get("digest")
        published = None if extra is None else Digest(str(extra["algo"]), str(extra["value"]))
    except (OSError, RuntimeError, KeyError, TypeError, EOFError) as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc}") from exc
    own = dict(model.named_parameters())
    if set(params) != set(own):
        raise WeightsError(f"weights file {path} holds other parameters than this model")
    ordered = [(name, params[name]) for name in own]
    if digest_named(ordered, SHA256_ALGO).value != sha:
        raise WeightsError(f"weights file {path}: parameters do not match its sha256")
    if published is not None and digest_named(ordered, published.algo) != published:
        raise WeightsError(
            f"weights file {path}: parameters do not match its {published.algo} digest"
        )
    with torch.no_grad():
        for name, target in own.items():
            if params[name].shape != target.shape or params[name].dtype != target.dtype:
                raise WeightsError(f"weights file {path}: {name} does not fit this model")
        for name, target in own.items():
            target.copy_(params[name])
    return int(version), published or Digest(SHA256_ALGO, str(sha))
