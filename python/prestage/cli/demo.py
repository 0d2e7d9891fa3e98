"""``prestage demo``: placeholder replaced below."""
