"""How bytes move between nodes: the transport protocol and partial-file helpers, HTTP pieces,
rsync over SSH.
"""
