"""File sync: manifests and their cache, the catalog of categories, pull planning, verified
downloads, recovery, the file routes.
"""
