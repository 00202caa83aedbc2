"""The running agent: sources -> one queue -> correlator -> sinks.

Sources run in their own threads and only put typed events on the queue. This thread alone
feeds the correlator (under the lock the Collector takes to render), so the correlator itself
needs no locking and stays pure.
"""
from __future__ import annotations

import logging
import os
import queue
import threading

from exporter.clock import MonotonicWallClock
from exporter.config import ConfigError, Options
from exporter.correlate import Correlator, CorrelatorConfig
from exporter.events import DeviceChange, MalformedInput, SourceStatus, Transition
from exporter.sources.base import Source, SourceUnavailable
from exporter.sources.sysfs import SysfsSource

log = logging.getLogger("exporter.agent")
TICK_SECONDS = 0.25


class StartupError(Exception):
    """The agent cannot start as configured; the message says why and what to do."""


def kubernetes_enabled(options: Options) -> bool:
    if options.kubernetes == "auto":
        return bool(options.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"))
    return options.kubernetes == "on"


def open_kernel_sources(options: Options, clock: MonotonicWallClock
                        ) -> tuple[list[Source], SysfsSource, list[SourceStatus]]:
    """Open the kernel sources asked for. `auto` takes every one that works and says why the
    others do not; a named source that cannot start is a StartupError with the fix."""
    auto = options.sources == ("auto",)
    wanted = ("bpf", "uevent", "sysfs") if auto else options.sources
    sysfs = SysfsSource(clock, options.sysfs_interval, options.sysfs_root, options.procfs_root,
                        emit_transitions="sysfs" in wanted)
    try:
        sysfs.open()  # always: the gauges' truth, even when sysfs transitions are not wanted
    except SourceUnavailable as e:
        raise StartupError(f"sysfs/procfs unreadable: {e}") from e
    opened: list[Source] = [sysfs]
    down: list[SourceStatus] = []
    for name in wanted:
        if name == "sysfs":
            continue
        source = _make(name, options, clock)
        try:
            source.open()
        except SourceUnavailable as e:
            if not auto:
                raise StartupError(f"--source {name}: {e.reason}. Fix: {e.fix}") from e
            log.warning("source %s unavailable: %s (fix: %s)", name, e.reason, e.fix)
            down.append(SourceStatus(name, False, clock.now(), e.reason))
            continue
        opened.append(source)
    return opened, sysfs, down


def _make(name: str, options: Options, clock) -> Source:
    if name == "bpf":
        from exporter.sources.bpf import BpfSource
        return BpfSource(clock, options.ringbuf_pages, options.sysfs_root)
    if name == "uevent":
        from exporter.sources.uevent import UeventSource
        return UeventSource(clock)
    raise ConfigError(f"unknown source {name}")


def open_kube_sources(options: Options, clock) -> list[Source]:
    from exporter import kube

    node = kube.resolve_node_name(options.node_name)
    sources = kube.build_sources(
        clock, node_name=node, kubeconfig=options.kubeconfig,
        podresources_socket=options.podresources_socket,
        podresources_interval=options.podresources_interval,
        kubelet_metrics_url=options.kubelet_metrics_url,
        balloon_selector=options.balloon_selector)
    log.info("kubernetes: watching node %s", node)
    return sources


class Agent:
    def __init__(self, options: Options, clock: MonotonicWallClock | None = None,
                 sinks: list | None = None):
        self.options = options
        self.clock = clock or MonotonicWallClock()
        self.queue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.kubernetes = kubernetes_enabled(options)
        self.correlator = Correlator(CorrelatorConfig(
            coalesce_window=options.coalesce_window,
            resync_deadline=options.resync_deadline,
            readmission_settle=options.readmission_settle,
            memory_tolerance_bytes=options.memory_tolerance_bytes,
            kubernetes=self.kubernetes), self.clock)
        self.sinks = list(sinks or [])
        self.sources: list[Source] = []
        self.sysfs: SysfsSource | None = None
        self.alive = threading.Event()
        self._malformed_logged: set[str] = set()
        self._version = 0  # bumped whenever the correlator's state may have changed

    def open(self) -> None:
        """Open every source (fails fast with StartupError), before serving anything."""
        self.sources, self.sysfs, down = open_kernel_sources(self.options, self.clock)
        if self.kubernetes:
            self.sources += open_kube_sources(self.options, self.clock)
        for status in down:  # already logged with its fix by open_kernel_sources
            self._process(status.source, status, quiet=True)
        log.info("sources running: %s", ", ".join(s.name for s in self.sources))
        programs = getattr(next((s for s in self.sources if s.name == "bpf"), None),
                           "attached", {})
        for prog, (ok, reason) in programs.items():
            if not ok:
                log.info("bpf program %s not attached: %s", prog, reason)

    def run(self, stop: threading.Event) -> None:
        for source in self.sources:
            source.start(self._emitter(source.name))
        self.alive.set()
        try:
            while not stop.is_set():
                try:
                    name, event = self.queue.get(timeout=TICK_SECONDS)
                except queue.Empty:
                    pass
                else:
                    self._process(name, event)
                self._tick()
        finally:
            self.alive.clear()
            self.shutdown()

    def shutdown(self) -> None:
        for source in self.sources:
            source.stop()  # BPF: detaches every probe
        while True:  # what the sources said before stopping still counts
            try:
                name, event = self.queue.get_nowait()
            except queue.Empty:
                break
            self._process(name, event)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.exception("closing sink %s", type(sink).__name__)

    def state_version(self) -> int:
        """Changes whenever what /metrics shows may have changed (lets scrapes share a render)."""
        return self._version

    def _emitter(self, name: str):
        put = self.queue.put
        return lambda event: put((name, event))

    def _process(self, name: str, event, quiet: bool = False) -> None:
        if isinstance(event, MalformedInput):
            self._log_malformed(event)
        elif isinstance(event, SourceStatus) and not event.up and event.reason and not quiet:
            log.warning("source %s down: %s", event.source, event.reason)
        for sink in self.sinks:  # the journal writes the raw event before it is acted on
            self._call(sink.on_event, event)
        with self.lock:
            updates = self.correlator.handle(event, name)
            self._version += 1
        for update in updates:
            for sink in self.sinks:
                self._call(sink.on_update, update)
        if name != "sysfs" and isinstance(event, (Transition, DeviceChange)) and self.sysfs:
            self.sysfs.poke()  # re-read the truth after every kernel event

    def _log_malformed(self, event: MalformedInput) -> None:
        # The first from each source at warning (someone must look), the rest at debug: a
        # stream of garbage must not flood the log; the counter has the totals.
        level = logging.DEBUG if event.source in self._malformed_logged else logging.WARNING
        self._malformed_logged.add(event.source)
        log.log(level, "malformed input from %s (counted, skipped): %s", event.source,
                event.detail)

    def _tick(self) -> None:
        with self.lock:
            updates = self.correlator.tick()
            if updates:
                self._version += 1
        for update in updates:
            for sink in self.sinks:
                self._call(sink.on_update, update)

    @staticmethod
    def _call(fn, arg) -> None:
        try:
            fn(arg)
        except Exception:  # a sink failing must not stop the agent or the other sinks
            log.exception("sink %s failed", getattr(fn, "__qualname__", fn))
