"""cluster_monitor: polls every node's /v1/status and draws one row per node (terminal, JSON,
NDJSON).
"""
