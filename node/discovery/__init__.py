"""node.discovery."""
