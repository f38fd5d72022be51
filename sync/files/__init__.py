"""sync.files."""
