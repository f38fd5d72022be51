"""sync.records."""
