"""One adapter per library, each run as ``python -m benchmarks.peers.<name>``.

Every adapter speaks the contract in :mod:`benchmarks.peers._common`: the
harness starts it with ``run --workload W --out FILE ...`` in the library's
own virtualenv, and the adapter writes one JSON result to ``FILE``.
Adapters are run with ``-m`` from the repository root, so a module named like
its library (``benchmarks.peers.arq``) never shadows the library itself.
"""
