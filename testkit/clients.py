"""Client threads a test runs against a server for the length of a `with` block."""
from __future__ import annotations

import threading
from typing import Any, Callable


class ClientThreads:
    """`n` daemon threads running `target(i)` until the `with` block ends: started on enter,
    told to stop (`self._stop`, which each loop watches) and joined, bounded, on exit. `_lock`
    guards the counters the subclass keeps."""

    join_timeout = 30.0

    def __init__(self, n: int, target: Callable[[int], Any]) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=target, args=(i,), daemon=True)
                         for i in range(n)]

    def __enter__(self) -> "ClientThreads":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.join_timeout)
