"""The journal's policy, in one place: where it may live (checked before SQLite touches
anything), the fix every refusal names, and `check`'s journal line. Where it is (the named path
or the default) is decided once with the other decisions, in exporter/config/decide.py.

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

A path the user named (--journal) must be creatable and open at start, or `run` exits 2 with
the fix; the default path degrades instead (logged, counted, retried).
"""
from __future__ import annotations

import logging
import os
import sqlite3
import stat
import tempfile
from pathlib import Path

from exporter.checks import FAIL, OK, Check
from exporter.config.decide import APP_DIR  # where it is: decided once with the others
from exporter.sinks.journal.schema import NEWER_FIX, SCHEMA_VERSION
from exporter.untrusted import NotRegularFile, open_regular

log = logging.getLogger(__name__)

SIDE_FILES = ("", "-wal", "-shm")
# The fix of every "cannot journal there" refusal.
WRITABLE_FIX = "a writable path on a local filesystem (--journal PATH), or --no-journal"
# The default path cannot be made (not root: under $HOME, which may be unwritable): journaling
# is off, said once with what to do (a log format: the path and the reason).
DEFAULT_UNWRITABLE = ("journal off: cannot create %s (%s); pass --journal PATH (writable) to "
                      "keep episodes across restarts, or --no-journal")


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
        raise JournalPathError(f"journal {path}: {directory} is not a directory. Fix: "
                               f"{WRITABLE_FIX}")
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


def check_journal(path: Path | None) -> list[Check]:
    """Can `run` journal where it would? A corrupt journal only costs a warning and a counter
    at run time (journaling stays off), so `check` is where it is said plainly."""
    if path is None:
        return [Check("journal", OK, "off (--no-journal)")]
    fix = (f"move it away (mv {path} {path}.corrupt): `run` starts a new one; until then "
           "nothing is journaled and node_resize_exporter_sink_errors_total{sink=\"journal\"} "
           "grows")
    try:
        check_journal_path(path)
    except JournalPathError as e:
        what, _, how = str(e).partition(". Fix: ")
        return [Check("journal", FAIL, what, how)]
    problem = cannot_create(path)  # tried, not guessed: root passes access() under /proc
    if problem:
        return [Check("journal", FAIL, f"{path}: {problem}", WRITABLE_FIX)]
    if not path.exists():
        return [Check("journal", OK, f"{path} does not exist yet; `run` creates it (0600)")]
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5) as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            problems = [r[0] for r in c.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.Error as e:
        return [Check("journal", FAIL, f"{path} is corrupt or not a journal: {e}", fix)]
    if problems != ["ok"]:
        return [Check("journal", FAIL, f"{path} is corrupt: {'; '.join(problems)[:300]}", fix)]
    if version > SCHEMA_VERSION:
        return [Check("journal", FAIL, f"{path} has schema {version}, newer than this "
                      f"exporter's {SCHEMA_VERSION}: `run` leaves it untouched and runs without "
                      "a journal (sink_up{sink=\"journal\"} 0)",
                      NEWER_FIX.replace("move the file away", f"mv {path} {path}.newer"))]
    return [Check("journal", OK, f"{path} readable, schema {version}, no corruption found")]
