"""The operations of :class:`delayq.store.Store`, one module per concern.

Each module holds a mixin over :class:`~delayq._store.base.StoreBase` (the
shared state and the script call); ``delayq/store.py`` composes them, builds
the clients' scripts and stays the one module that imports redis. Import the
public names from :mod:`delayq.store`.
"""
