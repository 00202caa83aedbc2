"""Logging as node_exporter does it: `--log.level` and `--log.format` (logfmt or json), UTC
timestamps with milliseconds.

Every value is quoted and escaped, so a newline or a quote inside a message (a node name, a
hostile API answer) cannot forge a log line.

Fields: a line's facts an index can search on, beside the message, come from the standard
`extra=` mechanism (`log.info("...", extra={"episode": ep.id, "resource": "cpu"})`): each key
becomes a field of its own, after ts, level, logger and msg (which it cannot replace). JSON keeps
numbers, booleans and lists as they are; logfmt writes them as text (a list comma-separated).
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


# What every LogRecord has: anything else on a record came in through `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}
_OWN = ("ts", "level", "logger", "msg", "err")
Value = str | int | float | bool | list[object]


def _plain(value: object) -> Value:
    """A field's value as JSON can hold it: scalars and lists as they are, anything else as
    its text."""
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [v if isinstance(v, (str, int, float, bool)) else str(v) for v in value]
    return str(value)


def _fields(record: logging.LogRecord) -> dict[str, Value]:
    out: dict[str, Value] = {"ts": _utc(record), "level": _NAMES.get(record.levelno, "info"),
                             "logger": record.name, "msg": record.getMessage()}
    if record.exc_info:
        out["err"] = logging.Formatter().formatException(record.exc_info)
    for key, value in vars(record).items():
        if key not in _STANDARD and key not in _OWN and not key.startswith("_"):
            out[key] = _plain(value)
    return out


def _text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _logfmt_value(value: str) -> str:
    if value and all(c.isalnum() or c in "-._:/@+" for c in value):
        return value
    return json.dumps(value, ensure_ascii=False)  # quotes, escapes \n, \" and controls


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(_text(v))}" for k, v in _fields(record).items())


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
