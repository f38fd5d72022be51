"""Training processes: elastic torch.distributed groups from the plan's rendezvous, the
launcher, and the cluster watching its training group: the ranks' progress, hangs, stragglers
and restarts (GET /v1/training).
"""
