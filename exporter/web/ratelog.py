"""One log line per kind of failure per interval: what outsiders can cause (clients that vanish,
bad handshakes, garbage requests) must not be able to flood the log."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

MAX_KINDS = 64  # kinds are fixed strings plus OpenSSL's reason codes; bounded all the same


class RateLimitedLog:
    """note(kind, message): the first note of a kind is logged; later ones within `interval`
    seconds are only counted, and the first one after it says how many were held back."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (last logged at, held back)

    def note(self, kind: str, message: str, *args: object, level: int = logging.DEBUG,
             exc_info: bool = False) -> bool:
        """Log it unless this kind was logged less than `interval` ago; True when logged."""
        now = self.clock()
        with self._lock:
            if kind not in self._kinds and len(self._kinds) >= MAX_KINDS:
                kind = "other"
            last, held = self._kinds.get(kind, (None, 0))
            if last is not None and now - last < self.interval:
                self._kinds[kind] = (last, held + 1)
                return False
            self._kinds[kind] = (now, 0)
        if held:
            message += f" (and {held} more like it in the last %ds)"
            args = (*args, int(now - last)) if last is not None else args
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True
