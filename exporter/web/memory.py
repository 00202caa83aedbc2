"""Give memory back after a burst of connections.

Each TLS connection costs OpenSSL some 48 KiB (the SSL object and its record buffers) and
Python its stream objects; a flood of connections that the server cuts and the attacker opens
again (hundreds a second past the connection cap) leaves glibc's heap grown and fragmented
after they are all freed: 600 clients holding half ClientHellos raised RSS from 70 to 248 MiB
and it stayed there. glibc returns free pages to the kernel only at the top of the heap, or
when asked: malloc_trim(0) releases every free page, wherever it is. Asked here once a burst
has closed at least TRIM_AFTER connections, at most once every TRIM_INTERVAL seconds, from the
event loop, after a full garbage collection: a failed handshake leaves its connection's objects
in reference cycles (exception, traceback, frames) that only the collector frees. Not glibc
(musl): nothing to do.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from typing import Callable

TRIM_AFTER = 64  # connections closed since the last trim
TRIM_INTERVAL = 5.0  # seconds between trims, at most
TRIM_DELAY = 1.0  # seconds after the closes that made a trim due


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class Trimmer:
    """closed() after each connection; when it returns a delay, call trim() that many seconds
    later (once: closed() returns None while a trim is pending)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 trim: Callable[[int], int] | None = None, delay: float = TRIM_DELAY) -> None:
        self.clock = clock
        self._trim = trim if trim is not None else _malloc_trim()
        self.delay = delay
        self._closed = 0
        self._last = clock() - TRIM_INTERVAL
        self._pending = False
        self.trims = 0

    def closed(self) -> float | None:
        self._closed += 1
        if self._trim is None or self._pending or self._closed < TRIM_AFTER:
            return None
        self._pending = True
        # A little after the burst's closes, and never sooner than TRIM_INTERVAL after the
        # last trim: under a sustained flood, one trim every TRIM_INTERVAL seconds.
        return max(self.delay, self._last + TRIM_INTERVAL - self.clock())

    def trim(self) -> None:
        self._pending = False
        if self._trim is None:
            return
        self._closed = 0
        self._last = self.clock()
        self.trims += 1
        gc.collect()  # what failed connections left in cycles (exceptions and their frames)
        self._trim(0)
