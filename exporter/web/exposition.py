"""/metrics bodies: prometheus_client's format negotiation and encoders, rendered once per state
version and format and shared by every scrape that asks for the same thing.
"""
from __future__ import annotations

import gzip
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import (
    CONTENT_TYPE_PLAIN_0_0_4,
    choose_encoder,
    generate_latest,
    gzip_accepted,
)
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import parse_version

# (content type, gzip) pairs kept. Content types are the negotiated formats, not the client's
# words (_negotiate): text 0.0.4, text 1.0.0 and OpenMetrics 1.0.0 and 2.0.0, each in one of four
# name escapings, and OpenMetrics without a version: 14, times gzip or not, all fit, so no client
# can evict another's rendering by rotating its Accept header.
CACHED_FORMATS = 32
GZIP_LEVEL = 6  # zlib's default: ~4x smaller here, a fraction of the cost of level 9

class _Forward:
    """Puts another registry's families into this one (the application's, next to the runtime's)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


# What is read of the exporter's own process: its CPU and memory (what it costs a node), its
# start (restarts), its descriptors against their limit (docs/security.md's connection cap).
# Left out, for the fleet's series budget (docs/metrics.md): process_virtual_memory_bytes (the
# address space, mostly mapped libraries, says nothing about cost), python_info (the image pins
# the interpreter) and python_gc_* (nine series nobody alerts on or graphs).
PROCESS_METRICS = frozenset({
    "process_cpu_seconds",  # prometheus_client names a counter family without _total
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
})


class _Process:
    """prometheus_client's ProcessCollector, only the families of PROCESS_METRICS."""

    def __init__(self) -> None:
        self.collector = ProcessCollector(registry=None)

    def collect(self) -> list[Metric]:
        return [f for f in self.collector.collect() if f.name in PROCESS_METRICS]


def with_runtime_metrics(registry: CollectorRegistry) -> CollectorRegistry:
    """`registry` plus the process_* families of PROCESS_METRICS (CPU, memory, file
    descriptors, start time), as every Prometheus client library names them."""
    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Forward(registry))
    combined.register(_Process())
    return combined


@dataclass(frozen=True)
class Rendering:
    body: bytes
    content_type: str
    gzipped: bool


@dataclass
class _Entry:
    rendering: Rendering
    version: object
    at: float


class Exposition:
    """The rendered /metrics, shared by concurrent scrapes.

    Rendered again only when the agent's state changed (`version`) or the last rendering is
    older than `max_age` (gauges such as drift_seconds, and process_*, move with time alone).
    Fifty scrapers arriving together cost one rendering per format, not fifty: the lock makes
    the rest wait for it. One rendering is kept per (content type, gzip) pair, at most
    CACHED_FORMATS of them.
    """

    def __init__(self, registry: CollectorRegistry, version: Callable[[], object] = lambda: None,
                 max_age: float = 1.0, runtime_metrics: bool = True):
        self.registry = with_runtime_metrics(registry) if runtime_metrics else registry
        self.version = version
        self.max_age = max_age
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, bool], _Entry] = OrderedDict()
        self.renderings = 0  # counted so tests can see the sharing work

    def cached(self, accept: str = "", accept_encoding: str = "") -> Rendering | None:
        """The rendering get() would return, if it is ready now; None rather than wait or
        render. Lets the event loop answer most scrapes without a thread hop."""
        _, content_type = self._negotiate(accept)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            entry = self._cache.get((content_type, gzip_accepted(accept_encoding)))
            if entry is None or entry.version != self.version() \
                    or time.monotonic() - entry.at >= self.max_age:
                return None
            return entry.rendering
        finally:
            self._lock.release()

    @staticmethod
    def _negotiate(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
        """prometheus_client's choice of encoder, with the content type (the cache key) made
        one of a fixed few: it echoes the client's OpenMetrics `version=` back, so each
        version a client invents (1.0.1, 1.0.2, ...) would be a rendering of its own, while
        the encoder only distinguishes below 2.0.0 from the rest."""
        try:
            encoder, content_type = choose_encoder(accept)
        except (TypeError, ValueError):
            # prometheus_client compares the client's `version=` as a tuple: "1.a" raises.
            return generate_latest, CONTENT_TYPE_PLAIN_0_0_4
        if not content_type.startswith("application/openmetrics-text; version=") \
                or "escaping=" not in content_type:
            return encoder, content_type  # a constant: text formats, OpenMetrics unversioned
        keywords = getattr(encoder, "keywords", {})
        escaping = keywords.get("escaping", openmetrics.UNDERSCORES)
        try:
            major = parse_version(keywords.get("version", "1.0.0"))[0]
        except (TypeError, ValueError, IndexError):
            major = 1
        version = "2.0.0" if isinstance(major, int) and major >= 2 else "1.0.0"
        return (partial(openmetrics.generate_latest, escaping=escaping, version=version),
                f"application/openmetrics-text; version={version}; charset=utf-8; "
                f"escaping={escaping}")

    def get(self, accept: str = "", accept_encoding: str = "") -> Rendering:
        encoder, content_type = self._negotiate(accept)
        gzipped = gzip_accepted(accept_encoding)
        key = (content_type, gzipped)
        with self._lock:
            version, now = self.version(), time.monotonic()
            entry = self._cache.get(key)
            if entry is None or entry.version != version or now - entry.at >= self.max_age:
                body = encoder(self.registry)
                self.renderings += 1
                if gzipped:
                    body = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
                entry = _Entry(Rendering(body, content_type, gzipped), version, now)
                self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > CACHED_FORMATS:
                self._cache.popitem(last=False)
            return entry.rendering
