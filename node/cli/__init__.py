"""The `shoal` command line: one typer app, one module per command group."""

from __future__ import annotations

from node.cli.app import app, main

__all__ = ["app", "main"]
