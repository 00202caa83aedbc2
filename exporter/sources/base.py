"""What every source is: something that starts, emits typed events, and stops."""
from __future__ import annotations

import logging
import threading
from typing import Callable

from exporter.checks import FAIL, OK, Check
from exporter.clock import Clock
from exporter.events import Event, Resource, SourceStatus

Emit = Callable[[Event], None]


class SourceUnavailable(Exception):
    """A source cannot start here. `reason` says what is wrong, `fix` what to do about it."""

    def __init__(self, reason: str, fix: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.reason} (fix: {self.fix})" if self.fix else self.reason


class Source:
    """A source runs its own daemon thread and pushes events through `emit`.

    Subclasses implement `open()` (may raise SourceUnavailable: called in the caller's thread so
    `--source X` can fail fast with the reason) and `loop(emit)` (runs until `stopping` is set).
    What the registry's traits promise (exporter/sources/registry.py) they implement too:
    `poke(resource)` for `poked_by`, `reports_cpu_transitions()`, `leave_cpu_transitions()`.
    `check()` says whether it can start here; opening and closing it is the default.
    """

    name = "source"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.log = logging.getLogger(type(self).__module__)

    def open(self) -> None:
        """Acquire what the source needs; raise SourceUnavailable with a fix if it cannot."""

    def loop(self, emit: Emit) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what open() acquired (called once, after the thread ended)."""

    def poke(self, resource: Resource) -> None:
        """Re-read soon: a kernel event of `resource` arrived (the agent calls this, in its
        thread, for the sources whose spec declares `poked_by`)."""
        raise NotImplementedError(f"source {self.name} declares poked_by without poke()")

    def reports_cpu_transitions(self) -> bool:
        """After open(): every CPU transition comes from this source (`reports_cpu_transitions`
        sources say whether their programs attached)."""
        return False

    def leave_cpu_transitions(self) -> bool:
        """Stop being woken for CPU transitions another source reports; True when arranged."""
        return False

    def check(self, what: str) -> list[Check]:
        """Can this source start here? Opened as `run` opens it, and closed again. `what` is its
        help text from the registry. A spec's `check` replaces this where opening is not the
        whole answer (BPF: the host's requirements, the programs attached)."""
        name = f"{self.name} source"
        try:
            self.open()
        except SourceUnavailable as e:
            return [Check(name, FAIL, e.reason, e.fix)]
        except Exception as e:  # noqa: BLE001 - `check` reports, it never prints a traceback
            return [Check(name, FAIL, f"cannot open: {e}"[:300],
                          "see the checks above (run as root?)")]
        self.close()
        return [Check(name, OK, f"opens ({what})")]

    def start(self, emit: Emit) -> None:
        self._thread = threading.Thread(target=self._run, args=(emit,), name=self.name,
                                        daemon=True)
        self._thread.start()

    def _run(self, emit: Emit) -> None:
        try:
            self.loop(emit)
        except Exception:  # a source dying must not take the agent down: say so and stop
            self.log.exception("source %s failed", self.name)
            emit(SourceStatus(self.name, False, self.clock.now(), "crashed; see log"))

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()
