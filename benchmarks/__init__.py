"""Peer benchmarks of leakjax kernels (issue 8); run `python -m benchmarks.run`."""
