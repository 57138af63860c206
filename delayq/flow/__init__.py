"""Flow control's values (docs/FLOW.md): a type's limits and their split over partitions
(``limits``), the dedup modes of an enqueue (``dedup``), the flow keys' backlog (``keys``),
priority levels (``priorities``) and ``set_limits``' :data:`~delayq.flow.control.KEEP`. The operations on the limits are
:mod:`delayq.operations.flow_control`; a consumer's waits after a held-back claim,
:mod:`delayq.runtime.flow_waits`. ``lua/claim.lua`` decides every limit.
"""
