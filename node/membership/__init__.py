"""node.membership."""
