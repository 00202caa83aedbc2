"""The floor of the per-transition comparison: the smallest programs that notice a CPU
transition, run beside the exporter in the same storm (bench/storm.py), so the online window
(bench/README.md) costs them what it costs the exporter, in the same minutes.

- **Python**: a process blocked on the kernel's uevent socket doing, per datagram, one recv and
  one split (bench/window.py's LISTENER: the least any Python program that is woken by a
  transition pays here).
- **C**: the same in C (poll, recv, a memchr walk over the fields), compiled with the system's
  `cc` into a temporary directory; left out, with a note, where there is no compiler.

Both count their datagrams and report nothing else: their CPU is read from
/proc/PID/task/*/schedstat (nanoseconds) by the storm, as the exporter's is.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.procs import thread_cpu_seconds
from bench.window import LISTENER

C_LISTENER = r"""
#include <linux/netlink.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(void)
{
	int s = socket(AF_NETLINK, SOCK_DGRAM, NETLINK_KOBJECT_UEVENT);
	struct sockaddr_nl addr = { .nl_family = AF_NETLINK, .nl_groups = 1 };
	static char buf[65536];
	long n = 0;
	if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		perror("uevent socket");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	struct pollfd fds[2] = { { .fd = s, .events = POLLIN }, { .fd = 0, .events = POLLIN } };
	for (;;) {
		if (poll(fds, 2, -1) < 0)
			return 1;
		if (fds[1].revents)
			break;
		ssize_t len = recv(s, buf, sizeof(buf), 0);
		char *p = buf, *end = buf + (len > 0 ? len : 0);
		while (p < end) { /* the fields, as the Python one splits them */
			char *nul = memchr(p, 0, end - p);
			p = nul ? nul + 1 : end;
		}
		n++;
	}
	printf("%ld\n", n);
	return 0;
}
"""


class Listener:
    """One minimal listener process: start() waits for "ready"; cpu_seconds() any time."""

    def __init__(self, name: str, cmd: list[str]):
        self.name = name
        self.cmd = cmd
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Listener":
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError(f"{self.name} listener did not start")
        return self

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return thread_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def compile_c(directory: str) -> str | None:
    """The C listener's binary, or None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, out = Path(directory) / "listener.c", Path(directory) / "listener"
    src.write_text(C_LISTENER)
    subprocess.run([cc, "-O2", "-o", str(out), str(src)], check=True)
    return str(out)


class Listeners:
    """Both listeners for the length of a `with`: name -> Listener."""

    def __enter__(self) -> dict[str, Listener]:
        self._tmp = tempfile.TemporaryDirectory(prefix="nre-listener-")
        self.running: dict[str, Listener] = {}
        try:
            self.running["python_listener"] = Listener(
                "python_listener", [sys.executable, "-c", LISTENER]).start()
            binary = compile_c(self._tmp.name)
            if binary is not None:
                self.running["c_listener"] = Listener("c_listener", [binary]).start()
        except BaseException:
            self.__exit__()
            raise
        return self.running

    def __exit__(self, *exc: object) -> None:
        for listener in self.running.values():
            listener.stop()
        self._tmp.cleanup()
