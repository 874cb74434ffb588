"""Log output of the worker: Faust's text lines, or one JSON object per line.

JSON lines carry `time` (UTC, RFC 3339), `level`, `logger`, `message`, the
context a log call passes with ``extra={...}`` (event ids, cycle ids, topic,
partition, offset, stage) and `exception` when there is one. Log calls pass
ids, never episode text: a log is kept, shipped and read by more people than
the view is.
"""

from __future__ import annotations

import logging
import logging.config
from datetime import datetime, timezone
from typing import Any

import orjson

from streams.settings import Settings

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except Exception:  # a bad %-format in a library's call must not lose the line
            message = str(record.msg)
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=str).decode()


def logging_config(settings: Settings) -> dict[str, Any] | None:
    """A logging.config dictionary for json, None for text (Faust's own)."""
    if settings.log_format != "json":
        return None
    level = settings.log_level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        # The real stderr: a Faust worker replaces sys.stdout/sys.stderr with
        # proxies that log what is printed, and a handler writing to one of
        # those would log its own lines again.
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json",
                              "stream": "ext://sys.__stderr__", "level": level}},
        "root": {"level": level, "handlers": ["json"]},
    }


def configure(settings: Settings) -> None:
    """Logging before the Faust worker takes over (topic creation, app set-up)."""
    config = logging_config(settings)
    if config is None:  # text: Faust configures it when the worker starts
        return
    logging.config.dictConfig(config)
    logging.captureWarnings(True)  # a warning printed raw would be a line that is not JSON


def worker_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of faust.Worker for these settings."""
    if settings.log_format != "json":
        return {"loglevel": settings.log_level}
    # quiet: no start-up banner, whose table is not JSON.
    return {"loglevel": settings.log_level, "logging_config": logging_config(settings), "quiet": True}



