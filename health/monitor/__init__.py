"""health.monitor."""
