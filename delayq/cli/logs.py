"""Logging for ``delayq worker``: ``--log-level`` and ``--log-format text|json``."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

__all__ = ["LEVELS", "JsonFormatter", "setup_logging"]

LEVELS = ("debug", "info", "warning", "error")

# fields the library puts on records about one delivery (see delayq.runtime.consumer)
_EVENT_FIELDS = ("event_type", "event_id", "attempt")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, delivery fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for name in _EVENT_FIELDS:
            if hasattr(record, name):
                data[name] = getattr(record, name)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{n}={getattr(record, n)}" for n in _EVENT_FIELDS if hasattr(record, n)]
        return f"{line} [{' '.join(fields)}]" if fields and "\n" not in line else line


def setup_logging(level: str, fmt: str) -> None:
    """Log to stderr at ``level`` in ``fmt`` (``text`` or ``json``); replaces root handlers."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            _TextFormatter("%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
