"""Logging as node_exporter does it: `--log.level` and `--log.format` (logfmt or json), UTC
timestamps with milliseconds.

Every value is quoted and escaped, so a newline or a quote inside a message (a node name, a
hostile API answer) cannot forge a log line.
"""
from __future__ import annotations

import json
import logging
import sys
import time

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "warning": logging.WARNING, "error": logging.ERROR}
_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn",
          logging.ERROR: "error", logging.CRITICAL: "error"}
# The HTTP and gRPC clients log every request and chunk at debug/info: only problems matter.
_NOISY = ("httpx", "httpcore", "httpx2", "httpcore2", "grpc")


def _utc(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) \
        + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, str]:
    out = {"ts": _utc(record), "level": _NAMES.get(record.levelno, "info"),
           "logger": record.name, "msg": record.getMessage()}
    if record.exc_info:
        out["err"] = logging.Formatter().formatException(record.exc_info)
    return out


def _logfmt_value(value: str) -> str:
    if value and all(c.isalnum() or c in "-._:/@+" for c in value):
        return value
    return json.dumps(value, ensure_ascii=False)  # quotes, escapes \n, \" and controls


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), ensure_ascii=False)


def setup(level: str = "info", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
