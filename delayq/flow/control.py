"""The value that tells ``set_limits`` to leave a limit as it is (:data:`KEEP`).

The operations on a type's limits are :mod:`delayq.operations.flow_control`.
"""

from __future__ import annotations

import enum
from typing import Literal

__all__ = ["KEEP", "Keep"]


class Keep(enum.Enum):
    """The type of :data:`KEEP`."""

    KEEP = "keep"


KEEP: Literal[Keep.KEEP] = Keep.KEEP
"""``set_limits``' default for a limit it should leave as it is."""
