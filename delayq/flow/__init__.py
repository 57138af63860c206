"""Flow control (docs/FLOW.md): the values of a type's limits (``limits``), the dedup modes of
an enqueue (``dedup``), the service's operations on a type's limits (``control``) and a
consumer's waits after a held-back claim (``waits``). ``lua/claim.lua`` decides every limit.
"""
