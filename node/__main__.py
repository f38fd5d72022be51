"""`python -m node` runs the `shoal` command line."""

from __future__ import annotations

from node.cli import main

main()
