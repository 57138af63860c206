"""The methods of :class:`~delayq.EventService`, one mixin per concern.

``EventService`` (:mod:`delayq.service`) combines them and keeps construction and
the lifecycle: :mod:`.handlers` (handlers, delivery groups), :mod:`.flow` (flow
control), :mod:`.enqueueing` (enqueue, cancel), :mod:`.schedules` (recurring
schedules), :mod:`.inspection` (lookups, dead letters, counts, repartitioning) and
:mod:`.browsing` (the dashboard's views, workers, history). Each method turns the
public arguments into internal ones and makes one call on one part declared in
:mod:`.parts`. Import the service from ``delayq``, not from here.
"""
