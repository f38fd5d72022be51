"""SWIM membership with Lifeguard: the member table, probe/suspect/dead rules, gossip, the signed
UDP wire.
"""
