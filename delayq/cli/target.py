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

__all__ = ["describe", "import_object", "load_event_type", "load_service"]

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
        if isinstance(obj, type):
            fail(f"{spec} is {describe(obj)}, not a function returning a delayq.EventService")
        try:
            obj = obj()
            if inspect.isawaitable(obj):
                obj = await obj
        except Exception as exc:
            log.debug("the factory %s failed", spec, exc_info=True)
            fail(f"the factory {spec} failed: {type(exc).__name__}: {exc}")
    if not isinstance(obj, EventService):
        if inspect.isfunction(obj) and not factory:
            hint = "; if it returns the service, add --factory"
        else:
            hint = _services_hint(spec)
        if factory:
            fail(f"{spec}() returned {describe(obj)}, not a delayq.EventService")
        fail(f"{spec} is {describe(obj)}, not a delayq.EventService{hint}")
    return obj


def describe(obj: object) -> str:
    """What ``obj`` is, in the words of someone writing a delayq app."""
    if isinstance(obj, type):
        if issubclass(obj, Event):
            return f"an event class ({obj.event_name!r})"
        return f"a class ({obj.__name__})"
    if inspect.ismodule(obj):
        return "a module"
    if inspect.iscoroutinefunction(obj):
        return "an async function"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "a function"
    if isinstance(obj, Event):
        return "an event"
    name = type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name} object"


def _services_hint(spec: str) -> str:
    """Point at the module's EventService instances (or say how to make one known)."""
    module_name = spec.partition(":")[0]
    module = sys.modules.get(module_name)
    found = sorted(
        name for name, value in vars(module or object()).items() if isinstance(value, EventService)
    )
    if found:
        return "; the module has " + ", ".join(f"{module_name}:{name}" for name in found[:5])
    return f"; name the service object, e.g. {module_name}:service"


def load_event_type(spec: str) -> type[Event]:
    """The Event subclass named by ``spec``."""
    obj = import_object(spec, "the event type")
    if not (isinstance(obj, type) and issubclass(obj, Event)) or obj is Event:
        module_name = spec.partition(":")[0]
        found = sorted(
            name
            for name, value in vars(sys.modules.get(module_name) or object()).items()
            if isinstance(value, type) and issubclass(value, Event) and value is not Event
        )
        hint = (
            ("; the module has " + ", ".join(f"{module_name}:{n}" for n in found[:5]))
            if found
            else ""
        )
        what = "delayq.Event itself" if obj is Event else describe(obj)
        fail(f"{spec} is {what}, not an event class (a subclass of delayq.Event){hint}")
    return obj
