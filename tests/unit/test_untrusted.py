"""The one reader of paths someone else controls: regular files only, never blocking on a
FIFO or a device, bounded in size and in time, links refused where the caller says so, and
every refusal naming what the caller read it for."""
from __future__ import annotations

import os
import threading
import time

import pytest

from exporter.untrusted import (
    CHUNK,
    NotRegularFile,
    OutOfTime,
    TooLarge,
    open_regular,
    read_bytes,
    read_text,
)


def test_reads_a_regular_file_whole_within_the_bound(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_bytes(b"50000 100000\n")
    assert read_bytes(f, 13) == b"50000 100000\n"
    assert read_text(f) == "50000 100000\n"
    with pytest.raises(TooLarge, match=r"--cgroup-root .*cpu.max: larger than 12 bytes"):
        read_bytes(f, 12, what="--cgroup-root")


def test_a_fifo_without_a_writer_is_refused_at_once_naming_the_flag(tmp_path):
    fifo = tmp_path / "cgroup.procs"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            read_bytes(fifo, what="--web.config.file", fix="give the path of a file")
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            done.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)  # a plain open() would block here for good
    assert not reader.is_alive(), "the read blocked on a FIFO"
    [e] = done
    assert isinstance(e, NotRegularFile)
    assert str(e) == (f"--web.config.file {fifo}: not a regular file (a FIFO); refused; "
                      "give the path of a file")
    assert e.reason == "not a regular file (a FIFO)"


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"),
                                        ("/", "a directory")])
def test_devices_and_directories_are_not_read(path, kind):
    with pytest.raises(NotRegularFile, match=kind):
        read_bytes(path)


def test_a_link_is_refused_where_the_caller_says_links_are_never_right(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("secret")
    link = tmp_path / "journal.db"
    link.symlink_to(target)
    assert read_text(link) == "secret"  # followed by default (mounted secrets are links)
    with pytest.raises(OSError):
        read_bytes(link, follow=False)
    with pytest.raises(OSError):
        open_regular(link, os.O_RDWR | os.O_CREAT, follow=False)
    assert target.read_text() == "secret"


def test_open_regular_creates_the_file_with_the_mode_asked(tmp_path):
    fd = open_regular(tmp_path / "j.db", os.O_RDWR | os.O_CREAT, 0o600, follow=False)
    try:
        assert os.fstat(fd).st_mode & 0o777 == 0o600
    finally:
        os.close(fd)


def test_the_time_budget_is_checked_inside_a_read(tmp_path, monkeypatch):
    big = tmp_path / "big"
    big.write_bytes(b"1\n" * (CHUNK * 4))
    with pytest.raises(OutOfTime, match="time budget"):
        read_bytes(big, deadline=time.monotonic() - 1)
    # Between chunks: a deadline that passes while the file is read stops it there.
    calls = []
    real_read = os.read

    def slow_read(fd: int, n: int) -> bytes:
        calls.append(n)
        time.sleep(0.05)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", slow_read)  # a slow disk: each chunk takes 50 ms
    with pytest.raises(OutOfTime):
        read_bytes(big, deadline=time.monotonic() + 0.01)
    assert len(calls) == 1  # stopped after the first chunk, not after the file
