"""The ``delayq`` command (``pip install 'delayq[cli]'``): workers and queue operations.

Importing :mod:`delayq` never imports this package (nor Typer or Rich).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Entry point of the ``delayq`` console script."""
    try:
        from .app import main as run
    except ImportError as exc:  # the cli extra is not installed
        sys.stderr.write(f"error: the delayq command needs: pip install 'delayq[cli]' ({exc})\n")
        sys.exit(2)
    sys.exit(run())
