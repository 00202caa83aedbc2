"""Run a real `node-resize-exporter run` as a subprocess and scrape it over HTTP."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent


# Listening ports for the servers the tests start come from below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default), one slice per pytest-xdist worker. A
# port the kernel picks for bind(0) is in the ephemeral range, where any process's next outgoing
# connection may take it between the pick and the server's bind ("address already in use", seen in
# CI on three workers); nothing picks ports below that range but these slices.
_PORTS_LOW, _PORTS_HIGH = 20000, 32000
_SLICES = 8
_next_port: list[int] = []


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else _SLICES - 1
    size = (_PORTS_HIGH - _PORTS_LOW) // _SLICES
    low = _PORTS_LOW + (index % _SLICES) * size
    return range(low, low + size)


def free_port() -> int:
    """A loopback port nothing listens on now, from this worker's slice, never the same twice in
    a row in one process (a port just closed may still be in TIME_WAIT)."""
    ports = _slice()
    if not _next_port:
        # Processes of one worker (a test and the lab or bench it starts) start apart.
        _next_port.append(ports.start + (os.getpid() * 7919) % len(ports))
    for _ in range(len(ports)):
        port = _next_port[0]
        _next_port[0] = port + 1 if port + 1 < ports.stop else ports.start
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {ports.start}-{ports.stop - 1}")


def poll_until(read, predicate, timeout: float, interval: float, fail):
    """read() until predicate(value) holds and return that value; past `timeout` raise
    fail(last value). The one polling loop of the tests, the lab and the benchmarks."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if predicate(value):
            return value
        if time.monotonic() > deadline:
            raise fail(value)
        time.sleep(interval)


def terminate(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGTERM (the exporter's clean stop), then SIGKILL if it does not go in `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Scrape:
    """One /metrics exposition, parsed: value(name, **labels)."""

    def __init__(self, text: str):
        self.text = text
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, default: float | None = None, **labels) -> float | None:
        return self.samples.get((name, frozenset(labels.items())), default)

    def total(self, name: str, **labels) -> float:
        """Sum of every series of `name` whose labels include `labels` (0 when none)."""
        want = set(labels.items())
        return sum(v for (n, lab), v in self.samples.items() if n == name and want <= lab)

    def series(self, name: str) -> dict[frozenset, float]:
        return {lab: v for (n, lab), v in self.samples.items() if n == name}


class RunningExporter:
    def __init__(self, *args: str, env: dict | None = None, journal: bool = False,
                 wrapper: tuple[str, ...] = ()):
        self.wrapper = tuple(wrapper)  # a command prefix: unshare -m ..., setpriv ...
        self.port = free_port()
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.tmp = tempfile.TemporaryDirectory(prefix="nre-test-")
        self.log_path = Path(self.tmp.name) / "exporter.log"
        if not journal and "--journal" not in self.args and "--no-journal" not in self.args:
            self.args.append("--no-journal")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "RunningExporter":
        cmd = [*self.wrapper, sys.executable, "-m", "exporter", "run", "--web.listen-address",
               f"127.0.0.1:{self.port}", "--log.level", "debug", *self.args]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exporter exited {self.proc.returncode}:\n{self.logs()}")
            if self.ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"exporter not ready in {timeout}s:\n{self.logs()}")

    def ready(self) -> bool:
        """/healthz answers 200 (subclasses that speak TLS override this)."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def logs_tail(self, chars: int = 6000) -> str:
        """The log without the per-scrape access lines, which drown everything else."""
        lines = [l for l in self.logs().splitlines() if "exporter.web.server" not in l]
        return "\n".join(lines)[-chars:]

    def scrape(self) -> Scrape:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return Scrape(r.read().decode())

    def wait_for(self, predicate, timeout: float = 30.0, interval: float = 0.05) -> Scrape:
        """Scrape until predicate(scrape) is true; the last scrape is in the error otherwise.

        The predicate names everything the caller then asserts on that another thread
        delivers (each source has its own, and /healthz answers before any of them spoke).
        The bound is for a loaded 2-vCPU CI machine: it costs nothing when the condition
        holds, which is the moment this returns."""
        return poll_until(self.scrape, predicate, timeout, interval, lambda scrape: AssertionError(
            f"condition not met in {timeout}s; last scrape:\n{scrape.text}\n"
            f"logs:\n{self.logs_tail()}"))

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        code = terminate(self.proc)
        self.log.close()
        return code

    def __enter__(self) -> "RunningExporter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.tmp.cleanup()
