"""The running machinery of a service: the scheduler, a consumer per handler and group (its
handler tasks and settlement), the heartbeat and history recorders (``periodic`` loops), and
``runtime``, which starts, restarts, reports (``health``) and closes them in order.
"""
