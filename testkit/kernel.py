"""Drive the real kernel's CPU and memory hotplug from tests, always restoring state."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

CPU_ROOT = Path("/sys/devices/system/cpu")
MEM_ROOT = Path("/sys/devices/system/memory")
LOCK_PATH = "/run/lock/node-resize-exporter-hotplug.lock"


def write_sysfs(path: Path, value: str) -> int:
    """One unbuffered write: 0 or the errno the kernel answered. (Python's buffered file
    objects retry a write that failed with EAGAIN on close, so a refused hotplug would be
    silently tried again.)"""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
        return 0
    except OSError as e:
        return e.errno or errno.EIO
    finally:
        os.close(fd)


@contextlib.contextmanager
def hotplug_lock():
    """One machine-wide lock for every test (any process) that hotplugs CPUs or memory."""
    os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
    with open(LOCK_PATH, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# The machine to itself: every test but the lab's holds QUIET_PATH shared while it runs
# (sharing_the_machine, tests/conftest.py); the lab's vCPU scenarios hold it exclusively
# (alone_on_the_machine). A test that wants to start meanwhile waits at TURNSTILE_PATH, so a
# stream of tests on the other workers cannot starve the lab.
QUIET_PATH = "/run/lock/node-resize-exporter-quiet.lock"
TURNSTILE_PATH = "/run/lock/node-resize-exporter-turnstile.lock"


def _lock_fd(path: str) -> int | None:
    """A descriptor to flock `path` with; None where this user cannot open it (the unit
    tests' unprivileged pass, which runs alone)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return None


@contextlib.contextmanager
def _flocked(*steps: tuple[str, int, bool]):
    """Each (path, flock operation, keep) in order; a step not kept is let go at once (the
    turnstile passed through). Everything is dropped when the block ends."""
    fds = []
    try:
        for path, operation, keep in steps:
            fd = _lock_fd(path)
            if fd is None:
                continue
            fds.append(fd)
            fcntl.flock(fd, operation)
            if not keep:
                fcntl.flock(fd, fcntl.LOCK_UN)
        yield
    finally:
        for fd in reversed(fds):
            os.close(fd)  # drops its lock


def sharing_the_machine():
    """Held while a test runs: it starts only when nobody holds the machine alone."""
    return _flocked((TURNSTILE_PATH, fcntl.LOCK_EX, False), (QUIET_PATH, fcntl.LOCK_SH, True))


@contextlib.contextmanager
def alone_on_the_machine():
    """No other test runs while this is held: new ones wait to start, the running ones are
    waited for. Yields the seconds it waited."""
    started = time.monotonic()
    with _flocked((TURNSTILE_PATH, fcntl.LOCK_EX, True), (QUIET_PATH, fcntl.LOCK_EX, True)):
        yield time.monotonic() - started


@dataclass
class Cpu:
    n: int

    @property
    def path(self) -> Path:
        return CPU_ROOT / f"cpu{self.n}" / "online"

    def hotpluggable(self) -> bool:
        return self.path.exists() and os.access(self.path, os.W_OK)

    def online(self) -> bool:
        return self.path.read_text().strip() == "1"

    def try_set_online(self, on: bool) -> int:
        return write_sysfs(self.path, "1" if on else "0")

    def set_online(self, on: bool) -> None:
        if self.online() != on:
            err = self.try_set_online(on)
            if err:
                raise OSError(err, f"cpu{self.n} online={int(on)}: {os.strerror(err)}")

    def fail_next(self, state: int) -> None:
        """The kernel's fault injection: the callback of `state` fails on the next transition."""
        (self.path.parent / "hotplug" / "fail").write_text(str(state))


@dataclass
class MemoryBlock:
    n: int

    @property
    def path(self) -> Path:
        return MEM_ROOT / f"memory{self.n}" / "state"

    def state(self) -> str:
        return self.path.read_text().strip()

    def try_offline(self) -> int:
        """0 on success, else the errno the kernel answered (EBUSY for a refused offline)."""
        return write_sysfs(self.path, "offline")

    def set_online(self, on: bool) -> None:
        want = "online" if on else "offline"
        if self.state() != want:
            err = write_sysfs(self.path, want)
            if err:
                raise OSError(err, f"memory{self.n} {want}: {os.strerror(err)}")


def memory_blocks() -> list[MemoryBlock]:
    if not MEM_ROOT.exists():
        return []
    return sorted((MemoryBlock(int(p.name[6:])) for p in MEM_ROOT.glob("memory[0-9]*")),
                  key=lambda b: b.n)


def _removable_candidates() -> list[MemoryBlock]:
    return [b for b in memory_blocks() if b.n > 0 and b.path.exists() and b.state() == "online"]


def find_offlinable_memory_block() -> MemoryBlock | None:
    """Try blocks low to high (low ones are the offlinable ones here); leave it online."""
    for block in _removable_candidates()[:120]:
        if block.try_offline() == 0:
            block.set_online(True)
            return block
    return None


def find_refused_memory_block() -> MemoryBlock | None:
    """The highest blocks hold kernel memory here and are refused with EBUSY."""
    for block in reversed(_removable_candidates()[-40:]):
        err = block.try_offline()
        if err == 0:
            block.set_online(True)
            continue
        if err == errno.EBUSY:
            return block
    return None


@dataclass
class Baseline:
    cpus_online: dict[int, bool]
    blocks_online: dict[int, bool]

    @classmethod
    def capture(cls) -> "Baseline":
        cpus = {}
        for p in CPU_ROOT.glob("cpu[0-9]*/online"):
            cpus[int(p.parent.name[3:])] = p.read_text().strip() == "1"
        blocks = {b.n: b.state() == "online" for b in memory_blocks() if b.path.exists()}
        return cls(cpus, blocks)

    def changed(self) -> bool:
        """Something online at capture is not online now (cheap: reads the state files)."""
        cpus = [Cpu(n) for n, was in self.cpus_online.items() if was]
        blocks = [MemoryBlock(n) for n, was in self.blocks_online.items() if was]
        return (any(c.path.exists() and not c.online() for c in cpus)
                or any(b.path.exists() and b.state() != "online" for b in blocks))

    def restore(self) -> None:
        for n, was_online in self.cpus_online.items():
            if was_online:
                with contextlib.suppress(OSError):
                    Cpu(n).set_online(True)
        for n, was_online in self.blocks_online.items():
            if was_online:
                with contextlib.suppress(OSError):
                    MemoryBlock(n).set_online(True)
