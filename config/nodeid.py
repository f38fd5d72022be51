"""The node id: given explicitly, or generated once and kept in the data dir."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from config.durable import fsync_directory
from config.errors import ConfigError
from config.fields import is_valid_node_id

NODE_ID_FILE = "node_id"


def _generated_id() -> str:
    host = socket.gethostname().split(".")[0].lower()
    host = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in host).strip("-_") or "node"
    return f"{host[:40]}-{secrets.token_hex(3)}"


def load_or_create_node_id(data_dir: Path, explicit: str | None = None) -> str:
    """`explicit` when given; else the id stored in `data_dir`, created durably on first use.

    Storing the id in the data dir (not the config file) means a copied config never gives
    two hosts the same id.
    """
    if explicit is not None:
        return explicit
    path = data_dir / NODE_ID_FILE
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the node id: {exc}") from exc
    if text:
        if not is_valid_node_id(text):
            raise ConfigError(f"{path}: holds an invalid node id {text!r}; fix or delete the file")
        return text
    node_id = _generated_id()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{NODE_ID_FILE}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(node_id + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(data_dir)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot store the node id: {exc}; check the data dir") from exc
    return node_id
