"""delayq's version, read once from the installed package's metadata (pyproject.toml is its
one source); ``"0+unknown"`` when delayq runs from a tree that was never installed."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("delayq")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
