"""The logs of the long-running commands (relay, worker) on stderr: one JSON object per line,
or one readable line per entry."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "event": ..., <fields>}``; fields come from
    ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        return json.dumps(entry, default=str, ensure_ascii=False)


class HumanFormatter(logging.Formatter):
    """``HH:MM:SS level event key=value ...`` for a person at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
        parts = [at, record.levelname.lower(), record.getMessage()]
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            parts.extend(f"{k}={v}" for k, v in fields.items())
        if record.exc_info and record.exc_info[1] is not None:
            parts.append(f"error={type(record.exc_info[1]).__name__}: {record.exc_info[1]}")
        return " ".join(parts)


def configure(level: str, name: str, json_lines: bool = True) -> logging.Logger:
    """The logger ``name``, writing to stderr at ``level``: JSON lines, or readable ones."""
    logger = logging.getLogger(name)
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else HumanFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger


def log(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    logger.log(level, event, extra={"fields": fields})
