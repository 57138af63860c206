"""The methods of :class:`~delayq.EventService`, one mixin per concern.

``EventService`` (:mod:`delayq.service`) combines them and keeps construction and
the lifecycle: :mod:`.handlers` (handlers, delivery groups), :mod:`.flow` (flow
control), :mod:`.enqueueing` (enqueue, cancel), :mod:`.schedules` (recurring
schedules), :mod:`.inspection` (lookups, dead letters, counts, repartitioning) and
:mod:`.browsing` (the dashboard's views, workers, history). Each method turns the
public arguments into internal ones and makes one call on one part declared in
:mod:`.parts`. Import the service from ``delayq``, not from here.

They stay mixins because they share nothing but those parts: each reads only the
parts (set once, by ``EventService._setup``) and its own private helpers (such as
``FlowMixin._flow_type``), sets no attribute, and calls no other mixin's method, so
each needs no more of its host than redis-py's command mixins do (``tests/test_seams.py``
checks it).
"""
