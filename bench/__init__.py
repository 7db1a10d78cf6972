"""Benchmarks with their own runner: `python -m bench <suite>`."""

import protocol  # noqa: F401  (gRPC's fork handlers off before grpc loads: see there)
