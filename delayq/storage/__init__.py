"""The Redis side, the only part of a service that sends Redis commands.

``store.Store`` owns one object per concern (``store.deliveries``, ``store.enqueueing``,
``store.scheduling``, ``store.groups``, ``store.types``, ``store.dead``,
``store.browsing``, ``store.limits``, ``store.schedules``, ``store.workers``, ...), each
given ``base.StoreCore`` (the clients, the keys, the scripts and running them) and the
other parts it uses; ``connect`` builds the clients and ``sentinel`` follows failovers.
Import the store's public names from :mod:`delayq.storage.store`.
"""
