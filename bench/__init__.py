"""Benchmarks with their own runner: `python -m bench <suite>`."""
