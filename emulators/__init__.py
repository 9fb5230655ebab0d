"""Local emulators that speak the real AWS wire formats, for tests, benchmarks and `make dev`."""
