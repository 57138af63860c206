"""Read-side views of the queues over the store: ``inspection`` (lookups, counts), ``browsing``
(the dashboard's views, run-now) and ``searching`` (the ready list, ids by prefix, dead letters
by error text).
"""
