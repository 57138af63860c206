"""Exceptions raised by delayq."""

from __future__ import annotations

__all__ = ["DecodeError", "DelayqError"]


class DelayqError(Exception):
    """Base class of delayq's own exceptions."""


class DecodeError(DelayqError):
    """A stored envelope could not be decoded into its event type."""
