"""The Redis side, the only part of a service that sends Redis commands.

``store.Store`` composes a mixin per concern (``enqueueing``, ``delivery``,
``scheduling``, ``groups``, ``dead``, ``browsing``, ``flow``, ``schedules``,
``workers``) over ``base.StoreBase`` (shared state, a shard's keys, running
scripts); ``connect`` builds the clients and ``sentinel`` follows failovers.
Import the store's public names from :mod:`delayq.storage.store`.
"""
