"""The service's write operations over the store: enqueueing and cancelling (``enqueueing``)
and delivery groups (``groups``: registering, removing, the pending registrations).
"""
