"""Partitioned event types: which shard an id routes to (``shards``), a partitioned type used as
one (``routing``), changing the number of partitions (``repartition``) and sharing the shards
out among the running schedulers (``spread``).
"""
