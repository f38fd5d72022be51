"""SWIM membership with Lifeguard: the member table, probe/suspect/dead rules, gossip, the UDP wire
sealed by the gossip keyring (or signed).
"""
