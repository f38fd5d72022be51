"""node.election."""
