"""Election: terms, votes and leases, role plans and their fences, the adoption log, the election
HTTP routes.
"""
