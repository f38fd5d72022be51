"""Record stores (games, rollouts): schemas, validation, group-commit SQLite stores, ingestion
routes, pulls by cursor, the client.
"""
