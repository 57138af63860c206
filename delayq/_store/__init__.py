"""The operations of :class:`delayq.store.Store`, one module per concern.

Each module holds a mixin over :class:`~delayq._store.base.StoreBase` (the
primitives: shared state, a shard's keys, running scripts); ``delayq/store.py``
composes them and sets up the clients and scripts. Import the public names
from :mod:`delayq.store`.
"""
