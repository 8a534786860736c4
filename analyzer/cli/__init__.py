"""The `analyze` command line: the main app (app.py) and the commands it gathers (offline, cache)."""
