"""What `node-resize-exporter check` prints: one line per thing that can or cannot start.

Every part that `run` starts answers for itself (a source's `check()`, a sink's, the web
endpoint's), with the same code `run` starts it with: `check` is `run` asking each part
whether it can start, and rendering the answers (exporter/cli/check.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"
DETAIL_MAX = 300  # characters of an error's text on a line


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn" (works, with less), "fail"
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status.upper():4} {self.name}: {self.detail}"
        return text + (f"\n     fix: {self.fix}" if self.fix and self.status != "ok" else "")


def failed(name: str, message: str) -> Check:
    """A FAIL line from a start-up error's message ("what. Fix: how"), as `run` would print it."""
    what, _, fix = message.partition(". Fix: ")
    return Check(name, FAIL, what, fix)


def quoted(text: object, limit: int = 200) -> str:
    """Text from outside (an API server's message): at most `limit` characters, with terminal
    escapes and newlines shown as escapes, never acted on or able to forge a line."""
    s = str(text)[:limit]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def guarded(name: str, check: Callable[..., list[Check]], *args: Any) -> list[Check]:
    """A part's check, whatever it meets (not root, a FIFO, a garbage tree): a failed line with
    the reason, never a traceback that hides the other lines."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 - reported as the check's result
        return [Check(name, FAIL, f"could not be checked: {_why(e)}"[:DETAIL_MAX],
                      "run check as root on the node")]


def _why(e: Exception) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.strerror or e}: {e.filename}"
    return repr(e)
