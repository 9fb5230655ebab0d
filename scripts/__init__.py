"""Developer scripts: `dev.py` is `make dev`."""
