"""Bounded, non-blocking reads of paths the exporter does not control.

`--path.sysfs`, `--path.procfs`, `--kubelet-root-dir`, `--cgroup-root`, `--web.config.file`,
the OTEL_* certificate files and `--journal` name places someone else can write. A FIFO there
blocked a plain open() forever (start-up hung, a scanner wedged for good), /dev/zero or a huge
file was read whole, and a link at the journal's path would have been followed as root. So
every such path is read here, one way:

- opened O_NONBLOCK (opening a FIFO returns at once, with or without a writer) and O_NOCTTY,
  and O_NOFOLLOW where the caller says a link is never right (the journal; files inside a
  cgroup tree), then refused unless fstat says it is a regular file: FIFOs, devices, sockets
  and directories never block and are never read;
- read up to a size bound: past it the read is refused as too large, never truncated silently
  (a cut CPU list would be a lie);
- within a time budget (a `deadline` on the monotonic clock) checked before the open and
  between chunks, so a scan of thousands of files stops inside a file, not only between them;
- every refusal names what the caller read it for (`what`: its flag, e.g. "--web.config.file")
  and, when given, the fix.

Errors are ValueError (Refused: not a regular file, too large, out of time) or OSError
(missing, unreadable), so a caller's `except (OSError, ValueError)` counts them as malformed.
"""
from __future__ import annotations

import os
import stat
import time

# sysfs and procfs files report st_size 4096 or 0 whatever they hold; /proc/meminfo is ~1.5 KB,
# a CPU list of 8192 CPUs at worst ~40 KB. A MiB is far above any real one.
SMALL = 1 << 20
CHUNK = 1 << 16


class Refused(ValueError):
    """The path is not a regular file, holds more than the bound, or took too long.
    `reason` is the problem alone ("not a regular file (a FIFO)"), for callers that word
    the message themselves."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class NotRegularFile(Refused):
    """A FIFO, a directory, a device or a socket where a file was expected."""


class TooLarge(Refused):
    """More bytes than the bound."""


class OutOfTime(Refused):
    """The time budget ran out before the read finished."""


def _name(path: str | os.PathLike[str], what: str) -> str:
    return f"{what} {os.fspath(path)}" if what else os.fspath(path)


def _with_fix(message: str, fix: str) -> str:
    return f"{message}; {fix}" if fix else message


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO", "a directory", ...)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return f"mode {mode:o}"


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o600, *,
                 follow: bool = True, what: str = "", fix: str = "") -> int:
    """A descriptor of the regular file at `path`, opened with `flags` (O_CREAT and `mode`
    allowed) without blocking on a FIFO or a device and, unless `follow`, without following a
    link (OSError ELOOP). NotRegularFile when it is anything else; OSError from open()."""
    flags |= os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags, mode)
    try:
        st_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(st_mode):
            reason = f"not a regular file ({kind_of(st_mode)})"
            raise NotRegularFile(_with_fix(f"{_name(path, what)}: {reason}; refused", fix),
                                 reason)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike[str], limit: int = SMALL, *, what: str = "",
               fix: str = "", follow: bool = True, deadline: float | None = None) -> bytes:
    """The file's content, at most `limit` bytes (more: TooLarge). Never blocks on a FIFO or a
    device; OutOfTime once `deadline` (time.monotonic()) has passed."""
    _check_time(path, what, fix, deadline)
    fd = open_regular(path, follow=follow, what=what, fix=fix)
    try:
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                reason = f"larger than {limit} bytes"
                raise TooLarge(_with_fix(f"{_name(path, what)}: {reason}; refused", fix),
                               reason)
            _check_time(path, what, fix, deadline)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int = SMALL, *, what: str = "",
              fix: str = "", follow: bool = True, deadline: float | None = None) -> str:
    """read_bytes decoded as UTF-8; undecodable bytes become U+FFFD, which no parser accepts."""
    return read_bytes(path, limit, what=what, fix=fix, follow=follow,
                      deadline=deadline).decode("utf-8", errors="replace")


def _check_time(path: str | os.PathLike[str], what: str, fix: str,
                deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        reason = "the time budget ran out"
        raise OutOfTime(_with_fix(f"{_name(path, what)}: {reason}; not read", fix), reason)
