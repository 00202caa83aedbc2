"""Bounded, non-blocking reads of the small files the sources read (sysfs, procfs, the
kubelet's checkpoints, cgroup files).

`--path.sysfs`, `--path.procfs` and `--kubelet-root-dir` name trees the exporter does not
control: a FIFO there blocked a plain open() forever (start-up hung), and a huge file was read
whole. Here the file is opened O_NONBLOCK (opening a FIFO for reading returns at once, with or
without a writer), refused unless it is a regular file, and read up to a bound: past it the
read is refused as too large, never truncated silently (a cut CPU list would be a lie).

Errors are ValueError (RefusedFile: not a regular file, too large) or OSError (missing,
unreadable), so a caller's existing `except (OSError, ValueError)` counts them as malformed.
"""
from __future__ import annotations

import os
import stat

# sysfs and procfs files report st_size 4096 or 0 whatever they hold; /proc/meminfo is ~1.5 KB,
# a CPU list of 8192 CPUs at worst ~40 KB. A MiB is far above any real one.
SMALL = 1 << 20


class RefusedFile(ValueError):
    """The path is not a regular file, or holds more than the bound."""


class NotRegularFile(RefusedFile):
    """A FIFO, a directory, a device or a socket where a file was expected."""


class TooLarge(RefusedFile):
    """More bytes than the bound."""


def read_bytes(path: str | os.PathLike[str], limit: int = SMALL) -> bytes:
    """The file's content, at most `limit` bytes (more: RefusedFile). Never blocks on a FIFO
    or a device, never follows into a directory."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{os.fspath(path)}: not a regular file "
                              f"({_kind(mode)}); refused")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise TooLarge(f"{os.fspath(path)}: larger than {limit} bytes; refused")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int = SMALL) -> str:
    """read_bytes decoded as UTF-8; undecodable bytes become U+FFFD, which no parser accepts."""
    return read_bytes(path, limit).decode("utf-8", errors="replace")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"
