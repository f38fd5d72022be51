"""`python -m node.cli` runs the `shoal` command line."""

from node.cli.app import main

main()
