"""The two exporters under test as processes: start, scrape, measure, stop.

Both are measured the same way from outside: CPU time from /proc/PID/stat (all threads, dead
ones included), memory from /proc/PID/smaps_rollup, readiness by scraping /metrics.
"""
from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from testkit.exporter_proc import free_port, terminate

REPO = Path(__file__).resolve().parent.parent
NODE_EXPORTER = "prometheus-node-exporter"  # Debian's name for node_exporter
CLK_TCK = os.sysconf("SC_CLK_TCK")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def node_exporter_path() -> str | None:
    return shutil.which(NODE_EXPORTER)


def parse_samples(text: str, name: str) -> dict[frozenset, float]:
    """Samples of one metric in an exposition, by label set. A plain line scan: the full
    prometheus_client parser costs milliseconds, which the latency polling cannot afford."""
    out: dict[frozenset, float] = {}
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest.startswith("{"):
            labels, _, value = rest[1:].partition("} ")
            out[frozenset(_LABEL.findall(labels))] = float(value)
        elif rest.startswith(" "):
            out[frozenset()] = float(rest[1:])
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return parse_samples(text, name).get(frozenset(labels.items()))


def thread_cpu_seconds(pid: int) -> float:
    """CPU seconds of the live threads from schedstat (nanoseconds): /proc/PID/stat counts
    10 ms ticks, too coarse for an idle minute (a few ticks either way)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
    return total / 1e9


def voluntary_switches(pid: int) -> int:
    """Voluntary context switches of the live threads: each is a thread going to sleep, so
    over a window they count its wake-ups (a thread's last sleep before the window aside)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
    return total


@dataclass
class ProcStats:
    cpu_seconds: float  # user + system, every thread
    rss_bytes: int
    anon_bytes: int


def proc_stats(pid: int) -> ProcStats:
    # /proc/PID/stat: the command is in parentheses and may hold spaces; fields follow it.
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    rollup = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            rollup[key] = int(parts[0]) * 1024
    return ProcStats((utime + stime) / CLK_TCK, rollup.get("Rss", 0), rollup.get("Anonymous", 0))


class Scraper:
    """HTTP/1.1 GETs of /metrics: on one kept-alive connection (as Prometheus scrapes), or on a
    fresh connection each time (keepalive=False)."""

    def __init__(self, port: int, timeout: float = 5.0, keepalive: bool = True):
        self.port = port
        self.timeout = timeout
        self.keepalive = keepalive
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str = "/metrics") -> str:
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=self.timeout)
            try:
                self.conn.request("GET", path)
                resp = self.conn.getresponse()
                body = resp.read()
                if not self.keepalive:
                    self.close()
                if resp.status != 200:
                    raise OSError(f"GET {path}: HTTP {resp.status}")
                return body.decode()
            except (http.client.HTTPException, ConnectionError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Exporter:
    """A process serving /metrics on 127.0.0.1; `ready(text)` says a scrape is valid."""

    name = "exporter"

    def __init__(self, cmd: list[str], port: int, cwd: Path | None = None):
        self.cmd = cmd
        self.port = port
        self.cwd = cwd
        self.tmp = tempfile.TemporaryDirectory(prefix="nre-bench-")
        self.log_path = Path(self.tmp.name) / "log"
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None

    def ready(self, text: str) -> bool:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> "Exporter":
        """Start and wait for the first valid scrape; startup_seconds is the time to it."""
        log = open(self.log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        scraper = Scraper(self.port, timeout=2)
        try:
            while time.monotonic() - t0 < timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n"
                                       f"{self.logs()[-3000:]}")
                try:
                    if self.ready(scraper.get()):
                        self.startup_seconds = time.monotonic() - t0
                        return self
                except OSError:
                    scraper.close()
                time.sleep(0.01)
        finally:
            scraper.close()
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {timeout}s:\n{self.logs()[-3000:]}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stats(self) -> ProcStats:
        return proc_stats(self.pid)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
        self.proc = None

    def __enter__(self) -> "Exporter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.tmp.cleanup()


class ResizeExporter(Exporter):
    """node-resize-exporter; ready when the BPF programs are attached (if BPF is a source)."""

    name = "node-resize-exporter"

    def __init__(self, sources: str = "auto", port: int | None = None,
                 journal: str | None = None):
        port = port or free_port()
        self.sources = sources
        journaling = ["--journal", journal] if journal else ["--no-journal"]
        # BENCH_EXPORTER_REPO: run another checkout's exporter (with this venv), for before /
        # after comparisons in the same minutes (bench/README.md).
        super().__init__([sys.executable, "-m", "exporter", "run", "--web.listen-address",
                          f"127.0.0.1:{port}", *journaling, "--source", sources,
                          "--log.level", "info"], port,
                         cwd=Path(os.environ.get("BENCH_EXPORTER_REPO", REPO)))

    def ready(self, text: str) -> bool:
        if self.sources in ("auto",) or "bpf" in self.sources.split(","):
            return (value(text, "node_resize_exporter_bpf_program_attached",
                          program="cpuhp_exit") == 1.0
                    and value(text, "node_resize_exporter_source_up", source="bpf") == 1.0)
        return value(text, "node_resize_kernel_capacity", resource="cpu", unit="core") is not None


class NodeExporter(Exporter):
    """Debian's prometheus-node-exporter with its packaged defaults (every default collector)."""

    name = "node_exporter"

    def __init__(self, port: int | None = None):
        path = node_exporter_path()
        if path is None:
            raise FileNotFoundError(f"{NODE_EXPORTER} is not installed: scripts/setup.sh bench")
        port = port or free_port()
        super().__init__([path, f"--web.listen-address=127.0.0.1:{port}"], port)

    def ready(self, text: str) -> bool:
        return "\nnode_cpu_seconds_total{" in text


def cpu_visible(text: str, cpu: int = 1) -> bool:
    """node_exporter shows a CPU while /proc/stat lists it, i.e. while it is online."""
    return f'node_cpu_seconds_total{{cpu="{cpu}",mode="idle"}}' in text


def mem_total(text: str) -> float | None:
    return value(text, "node_memory_MemTotal_bytes")
