"""Training processes: elastic torch.distributed groups from the plan's rendezvous, and the
launcher.
"""
