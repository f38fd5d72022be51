"""node.training."""
