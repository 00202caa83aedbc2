"""The trace sink: one OpenTelemetry trace per episode, exported when the episode ends.

Each episode is exported once: the journal's exported flag survives a restart, so a resumed
episode is not traced twice. What to export to is env.py's; the span tree is spans.py's.
"""
from __future__ import annotations

import logging
from typing import Protocol

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import exporter
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.events import Event
from exporter.sinks.traces.env import (
    TraceConfig,
    span_exporters,
    trace_config_from_env,
    trace_resource,
)
from exporter.sinks.traces.spans import build_trace

log = logging.getLogger("exporter.sinks.traces")


class ExportedFlag(Protocol):
    """What the trace sink needs from the journal (exporter.sinks.journal.store.Journal)."""

    def is_exported(self, episode_id: str) -> bool: ...

    def mark_exported(self, episode_id: str) -> None: ...


class _CountingExporter(SpanExporter):
    """Counts batches an exporter could not deliver (collector down, refused) in the sink's
    `errors`, which the metrics show; the SDK itself only logs them."""

    def __init__(self, inner: SpanExporter, sink: "TraceSink") -> None:
        self.inner = inner
        self.sink = sink

    def export(self, spans) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is not SpanExportResult.SUCCESS:
            self.sink.errors += 1
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class TraceSink:
    """Builds and exports an episode's trace when the episode ends (a Sink)."""

    def __init__(self, config: TraceConfig, *, journal: ExportedFlag | None = None,
                 node_name: str | None = None, host_name: str | None = None) -> None:
        self.config = config
        self.journal = journal
        self.exported = 0  # traces handed to the exporters
        self.errors = 0  # traces not built, or batches not delivered
        self._seen: set[str] = set()  # exported in this process (no journal, or it failed)
        self.provider = TracerProvider(resource=trace_resource(node_name, host_name))
        for span_exporter in span_exporters(config):
            # OTEL_BSP_* read by the processor itself (checked in trace_config_from_env).
            self.provider.add_span_processor(
                BatchSpanProcessor(_CountingExporter(span_exporter, self)))
        self.tracer = self.provider.get_tracer("exporter.sinks.traces", exporter.__version__)

    @classmethod
    def from_env(cls, **kwargs) -> "TraceSink | None":
        """A sink configured by the OTEL_* variables, or None when they do not ask for traces."""
        config = trace_config_from_env()
        return None if config is None else cls(config, **kwargs)

    # ------------------------------------------------------------ Sink

    def on_event(self, event: Event) -> None:
        pass  # traces are built from episodes, not raw events

    def on_update(self, update: EpisodeUpdate) -> None:
        if update.kind is not UpdateKind.ENDED:
            return
        ep = update.episode
        if ep.id in self._seen or (self.journal is not None and self.journal.is_exported(ep.id)):
            log.debug("episode %s already exported as a trace", ep.id)
            return
        try:
            build_trace(self.tracer, ep)
        except Exception:  # a bad episode must not stop the agent: count it, log the why
            self.errors += 1
            log.exception("could not build the trace of episode %s", ep.id)
            return
        self._seen.add(ep.id)
        self.exported += 1
        if self.journal is not None:
            self.journal.mark_exported(ep.id)

    def flush(self, timeout_ms: int = 10_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def close(self) -> None:
        self.provider.force_flush(10_000)
        self.provider.shutdown()
