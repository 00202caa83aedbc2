"""A slow disk for tests: a FUSE passthrough file system whose writes and fsyncs each take a
set delay (Debian's python3-fusepy; the kernel's FUSE, so the exporter's writes really block in
the kernel as they would on a slow or failing device).

The most real slow disk would be a device-mapper `delay` target on a loop device; this kernel
has no device-mapper at all (no CONFIG_BLK_DEV_DM, no dm_delay module), and FUSE is there. A
FUSE write is synchronous (no writeback cache here), so every write(2) and fsync(2) SQLite makes
waits the delay, which is what "a journal write delayed 300 ms" means to the process.

    with SlowFs(backing_dir, mountpoint, write_delay=0.3):
        ...  # files under mountpoint live in backing_dir

Run as its own process (`python -m testkit.slowfs BACKING MOUNT DELAY`), so the FUSE server's
threads and GIL are not the test's; unmounted with fusermount/umount in `finally`.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MOUNT_TIMEOUT = 20.0


class SlowFs:
    """Mounts BACKING at MOUNT through a delaying FUSE server (a child process)."""

    def __init__(self, backing: Path, mount: Path, write_delay: float) -> None:
        self.backing, self.mount, self.write_delay = Path(backing), Path(mount), write_delay
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SlowFs:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "testkit.slowfs", str(self.backing),
                                      str(self.mount), str(self.write_delay)],
                                     cwd=Path(__file__).resolve().parent.parent,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.poll() is not None and \
                    self.proc.stderr else ""
                self.__exit__()
                raise RuntimeError(f"slowfs did not mount {self.mount}: {err}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if os.path.ismount(self.mount):
            subprocess.run(["umount", "-l", str(self.mount)], check=False)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stderr:
                self.proc.stderr.close()


def _serve(backing: str, mount: str, delay: float) -> None:
    try:  # Debian's python3-fusepy names the module fusepy; PyPI's fusepy names it fuse
        from fusepy import FUSE, FuseOSError, Operations
    except ImportError:
        from fuse import FUSE, FuseOSError, Operations

    class Slow(Operations):  # type: ignore[misc]
        """Passthrough to `backing`; write/fsync/truncate sleep `delay` first."""

        def __init__(self) -> None:
            self.root = backing

        def _p(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def __call__(self, op: str, *args: Any) -> Any:
            try:
                return super().__call__(op, *args)
            except OSError as e:
                raise FuseOSError(e.errno or errno.EIO) from None

        def access(self, path: str, mode: int) -> None:
            if not os.access(self._p(path), mode):
                raise FuseOSError(errno.EACCES)

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(self._p(path))
            return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode",
                                                "st_mtime", "st_nlink", "st_size", "st_uid")}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._p(path))]

        def chmod(self, path: str, mode: int) -> None:
            os.chmod(self._p(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            os.chown(self._p(path), uid, gid)

        def mkdir(self, path: str, mode: int) -> None:
            os.mkdir(self._p(path), mode)

        def rmdir(self, path: str) -> None:
            os.rmdir(self._p(path))

        def unlink(self, path: str) -> None:
            os.unlink(self._p(path))

        def rename(self, old: str, new: str) -> None:
            os.rename(self._p(old), self._p(new))

        def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
            os.utime(self._p(path), times)

        def statfs(self, path: str) -> dict[str, Any]:
            sv = os.statvfs(self._p(path))
            return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize",
                                                "f_favail", "f_ffree", "f_files", "f_flag",
                                                "f_frsize", "f_namemax")}

        def open(self, path: str, flags: int) -> int:
            return os.open(self._p(path), flags)

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return os.open(self._p(path), os.O_RDWR | os.O_CREAT, mode)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            time.sleep(delay)
            return os.pwrite(fh, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            time.sleep(delay)
            os.truncate(self._p(path), length)

        def flush(self, path: str, fh: int) -> None:
            pass

        def release(self, path: str, fh: int) -> None:
            os.close(fh)

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            time.sleep(delay)
            os.fsync(fh)

    FUSE(Slow(), mount, foreground=True, nothreads=False, allow_other=True)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2], float(sys.argv[3]))
