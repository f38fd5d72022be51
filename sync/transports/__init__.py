"""sync.transports."""
