"""Peer benchmarks of leakjax kernels; run `python -m benchmarks.run`."""
