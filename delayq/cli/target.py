"""Finding the user's objects from ``module:attribute`` strings (like ``uvicorn module:app``)."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from typing import Any

from ..events import Event
from ..service import EventService
from .output import fail

__all__ = ["import_object", "load_event_type", "load_service"]

log = logging.getLogger("delayq.cli")


def import_object(spec: str, what: str) -> Any:
    """Import ``module.path:attr.path``; every problem becomes a one-line :class:`CliError`."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        fail(f"{what} must look like 'package.module:attribute', not {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app's own package
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            fail(f"cannot import {module_name!r}: no module named {exc.name!r}")
        log.debug("importing %s failed", module_name, exc_info=True)
        fail(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}")
    except Exception as exc:
        log.debug("importing %s failed", module_name, exc_info=True)
        fail(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}")
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            fail(f"module {module_name!r} has no attribute {attr_path!r}")
    return obj


async def load_service(spec: str, factory: bool) -> EventService:
    """The :class:`EventService` named by ``spec`` (or returned by calling it, with ``factory``)."""
    obj = import_object(spec, "the service")
    if factory:
        if not callable(obj):
            fail(f"{spec} is not callable (--factory needs a zero-argument function)")
        try:
            obj = obj()
            if inspect.isawaitable(obj):
                obj = await obj
        except Exception as exc:
            log.debug("the factory %s failed", spec, exc_info=True)
            fail(f"the factory {spec} failed: {type(exc).__name__}: {exc}")
    if not isinstance(obj, EventService):
        hint = " (did you mean --factory?)" if callable(obj) and not factory else ""
        fail(f"{spec} is a {type(obj).__name__}, not a delayq.EventService{hint}")
    return obj


def load_event_type(spec: str) -> type[Event]:
    """The Event subclass named by ``spec``."""
    obj = import_object(spec, "the event type")
    if not (isinstance(obj, type) and issubclass(obj, Event)) or obj is Event:
        fail(f"{spec} is not a subclass of delayq.Event")
    return obj
