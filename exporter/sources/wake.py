"""Waiting without spinning, for sources that re-read small files when told to.

A source that reads state the kernel or the kubelet changes (a checkpoint, a cgroup's cpuset)
sleeps in poll(2) on an eventfd (another thread's `poke()`: a kernel event arrived), optionally
an inotify descriptor (the file changed) and a timeout (the slow safety re-read). One wake-up
per reason, however many pokes came in between: never a busy loop. Not a source itself.
"""
from __future__ import annotations

import os
import select

from exporter.clock import Clock
from exporter.events import Resource, SourceStatus
from exporter.sources.base import Emit, Source

# s between re-reads when nothing pokes: files are also re-read on inotify and every kernel
# event, so this only bounds what a missed notification can cost
STATE_INTERVAL = 30.0


class Waker:
    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._extra: int | None = None

    def watch(self, fd: int) -> None:
        """Also wake when `fd` (an inotify descriptor) is readable."""
        self._extra = fd
        self._poll.register(fd, select.POLLIN)

    def unwatch(self) -> None:
        """Stop watching the fd given to watch() (call before closing it)."""
        if self._extra is not None:
            self._poll.unregister(self._extra)
            self._extra = None

    def poke(self) -> None:
        """Wake the waiting thread (any thread may call this, any number of times)."""
        if self._fd < 0:  # closed: a poke while the agent drains its queue at shutdown
            return
        try:
            os.eventfd_write(self._fd, 1)
        except OSError:  # closed during shutdown, or the counter is full: a wake-up is pending
            pass

    def wait(self, timeout: float) -> tuple[bool, bool]:
        """Sleep up to `timeout` seconds. Returns (poked, fd_ready); both False on timeout.
        The poke counter is drained; reading the watched fd is the caller's job."""
        ready = {fd for fd, _ in self._poll.poll(max(0, int(timeout * 1000)))}
        poked = self._fd in ready
        if poked:
            try:
                os.eventfd_read(self._fd)
            except BlockingIOError:
                pass
        return poked, self._extra is not None and self._extra in ready

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class PokedSource(Source):
    """A source that sleeps on its Waker: until its interval passes, `stop()`, or `poke()` (the
    agent pokes it after every kernel event). The default loop says it is up, then reads
    (`read(emit)`) after every wake-up; subclasses with more to wait for override `loop`."""

    interval = 60.0

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.waker = Waker()

    def up_reason(self) -> str:
        return ""

    def read(self, emit: Emit) -> None:
        raise NotImplementedError

    def loop(self, emit: Emit) -> None:
        emit(SourceStatus(self.name, True, self.clock.now(), self.up_reason()))
        while not self.stopping.is_set():
            self.read(emit)
            self.waker.wait(self.interval)

    def poke(self, resource: Resource | None = None) -> None:
        self.waker.poke()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.waker.poke()  # wake the wait now, not at the next interval
        super().stop(timeout)

    def close(self) -> None:
        self.waker.close()
