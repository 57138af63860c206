"""Benchmarks: delayq against its Python peers on one fresh Redis (``python -m benchmarks``).

This package must stay importable with the standard library alone: the peer
adapters in :mod:`benchmarks.peers` run inside each peer's own virtualenv.
"""
