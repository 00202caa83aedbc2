"""Where the journal may live: checked before SQLite touches anything.

The exporter runs as root and makes the journal 0600. A journal path that is a symbolic link
would make it chmod (and then overwrite) whatever the link points at, an empty target would
become a database, a dangling one would be created; a FIFO would hang start-up. A directory
other users can write lets them plant such a link at any time. So:
- the journal file and its -wal/-shm companions must be regular files or absent, never links
  (checked with lstat, and the file is opened with O_NOFOLLOW so a link planted after the check
  fails the open instead of being followed);
- the directory must not be writable by group or others. The exporter's own directory
  (`node-resize-exporter`, owned by us) is tightened to 0700 with a warning; any other
  directory is refused, since changing the mode of a directory we did not make (/tmp) would be
  worse than not starting.
A refusal is a JournalPathError whose message says what is wrong and how to fix it; the
composition root turns it into exit 2.

`cannot_create` answers "could `run` make the journal there?" by trying, not by reading mode
bits: root passes every access() test, yet nothing can be created under /proc or /sys.
"""
from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

from exporter.untrusted import NotRegularFile, open_regular

log = logging.getLogger("exporter.sinks.journal.store")

APP_DIR = "node-resize-exporter"
SIDE_FILES = ("", "-wal", "-shm")


class JournalPathError(Exception):
    """The journal path is unsafe to open as root; the message names the fix."""


def check_journal_path(path: Path) -> None:
    """Refuse (JournalPathError) or tighten the journal's place before it is opened."""
    _check_directory(path.parent, path)
    for suffix in SIDE_FILES:
        _check_file(Path(f"{path}{suffix}"))


def _check_directory(directory: Path, path: Path) -> None:
    try:
        st = os.stat(directory)  # a link to a directory is fine: only who can write it matters
    except FileNotFoundError:
        return  # the journal creates it 0700
    if not stat.S_ISDIR(st.st_mode):
        raise JournalPathError(f"journal {path}: {directory} is not a directory. Fix: pass "
                               "--journal PATH in a directory, or --no-journal")
    loose = stat.S_IMODE(st.st_mode) & 0o022
    if not loose:
        return
    if directory.name == APP_DIR and st.st_uid == os.geteuid():
        os.chmod(directory, 0o700)
        log.warning("journal directory %s was mode %o (writable by others); tightened to 0700",
                    directory, stat.S_IMODE(st.st_mode))
        return
    raise JournalPathError(
        f"journal {path}: its directory {directory} is writable by "
        f"{'others' if loose & 0o002 else 'its group'} (mode {stat.S_IMODE(st.st_mode):o}): "
        "another user could replace the journal with a link. Fix: chmod 0700 "
        f"{directory}, or put the journal in a directory only this user can write (the "
        f"default /var/lib/{APP_DIR}/)")


def _check_file(candidate: Path) -> None:
    try:
        st = os.lstat(candidate)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise JournalPathError(
            f"journal {candidate} is a symbolic link (to {os.readlink(candidate)!r}); refused: "
            "the journal is made 0600 and written as root, so a link would change another "
            "file. Fix: remove the link, or pass --journal with the real path")
    if not stat.S_ISREG(st.st_mode):
        raise JournalPathError(f"journal {candidate} is not a regular file ({_kind(st.st_mode)})"
                               ". Fix: remove it, or pass --journal PATH to a regular file")


def open_private(path: Path) -> int:
    """Open (creating 0600) the journal file without following a link or blocking on a FIFO;
    OSError when it is not a regular file. Returns the fd."""
    try:
        return open_regular(path, os.O_RDWR | os.O_CREAT, 0o600, follow=False)
    except NotRegularFile as e:
        raise OSError(f"journal {path} is not a regular file ({e.reason})") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return f"mode {mode:o}"


def cannot_create(path: Path) -> str:
    """Why the journal at `path` cannot be made or written ("" when it can). Tries it: a
    temporary file (or, where directories are missing, a temporary directory) in the nearest
    existing ancestor, removed at once; an existing journal must be writable."""
    if path.is_dir():
        return "is a directory"
    if path.exists():
        return "" if os.access(path, os.W_OK) else "not writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:  # created on open: the first
        parent = parent.parent                            # existing ancestor decides
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:
        if parent == path.parent:
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".node-resize-exporter.", suffix=".probe",
                                      dir=parent))
    except OSError as e:
        return f"cannot create {'files' if parent == path.parent else 'directories'} in " \
               f"{parent} ({e.strerror or e})"
    return ""
