"""The trace sink: one OpenTelemetry trace per episode, exported when the episode ends.

Each episode is exported once: the journal's exported flag survives a restart, so a resumed
episode is not traced twice. What to export to is env.py's; the span tree is spans.py's.

Shutdown is bounded: the SDK's force_flush ignores its timeout and an
OTLP export retries for up to OTEL_EXPORTER_OTLP_TIMEOUT, so a collector that never answers made
SIGTERM take 57 s, past Kubernetes' 30 s grace period. close() flushes and shuts down in a
helper thread for at most CLOSE_TIMEOUT seconds; traces still queued then are counted in
`errors` and dropped. The SDK's own warnings (a collector resetting connections, an export
failing) are logged at most once per LOG_INTERVAL per message, with how many were held back.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Protocol, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import exporter
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.events import Event
from exporter.ratelog import RateLimitFilter, rate_limit_loggers
from exporter.sinks.traces.env import (
    TraceConfig,
    span_exporters,
    trace_config_from_env,
    trace_resource,
)
from exporter.sinks.traces.spans import build_trace

log = logging.getLogger(__name__)

# Seconds close() waits for the last traces to go: well within a 30 s grace period, with the
# journal's own flush before it (the agent closes the journal first).
CLOSE_TIMEOUT = 8.0
LOG_INTERVAL = 60.0
# The loggers the OTLP exporters and the batch processor warn on, once per failed attempt, and
# urllib3's (under the HTTP exporter: a junk header on a collector's answer is a warning with a
# traceback on every export).
SDK_LOGGERS = ("urllib3.connectionpool", "urllib3.connection",
               "opentelemetry.exporter.otlp.proto.http.trace_exporter",
               "opentelemetry.exporter.otlp.proto.http._common",
               "opentelemetry.exporter.otlp.proto.grpc.exporter",
               "opentelemetry.sdk._shared_internal",
               "opentelemetry.sdk.trace.export",
               # urllib3 warns with a traceback when a collector's answer has a header line
               # that is not one (a broken proxy), on every export: one line an interval.
               "urllib3.connection", "urllib3.connectionpool")


# One filter on every SDK logger: a collector flapping for a minute is one line, not twelve.
_SDK_FILTER = RateLimitFilter(LOG_INTERVAL)
_header_defects = threading.local()  # per export thread: urllib3 found the answer's headers bad


class _HeaderDefect(logging.Filter):
    """Marks an export whose answer urllib3 could not parse the headers of: the SDK counts it
    delivered (the status was 200), _CountingExporter counts it an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Failed to parse headers"):
            _header_defects.seen = True
        return True


_DEFECT_FILTER = _HeaderDefect()


def quiet_sdk_loggers() -> None:
    """Rate-limit the OTel SDK's warnings (idempotent)."""
    for name in SDK_LOGGERS:  # first: it sees what the rate limit then holds back
        logger = logging.getLogger(name)
        if _DEFECT_FILTER not in logger.filters:
            logger.addFilter(_DEFECT_FILTER)
    rate_limit_loggers(SDK_LOGGERS, _SDK_FILTER)


class ExportedFlag(Protocol):
    """What the trace sink needs from the journal (exporter.sinks.journal.sink.JournalSink)."""

    def is_exported(self, episode_id: str) -> bool: ...

    def mark_exported(self, episode_id: str) -> None: ...


class _CountingExporter(SpanExporter):
    """Counts batches an exporter could not deliver (collector down, refused) in the sink's
    `errors`, which the metrics show; the SDK itself only logs them."""

    def __init__(self, inner: SpanExporter, sink: "TraceSink") -> None:
        self.inner = inner
        self.sink = sink

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        _header_defects.seen = False
        result = self.inner.export(spans)
        if result is not SpanExportResult.SUCCESS or _header_defects.seen:
            self.sink.errors += 1
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class TraceSink:
    """Builds and exports an episode's trace when the episode ends (a Sink)."""

    name = "trace"  # the `sink` label of its errors (exporter/sinks/metrics.py)

    def __init__(self, config: TraceConfig, *, journal: ExportedFlag | None = None,
                 node_name: str | None = None, host_name: str | None = None) -> None:
        self.config = config
        self.journal = journal
        self.exported = 0  # traces handed to the exporters
        self.errors = 0  # traces not built, or batches not delivered
        self._seen: set[str] = set()  # exported in this process (no journal, or it failed)
        quiet_sdk_loggers()
        # No atexit shutdown of its own: close() is bounded, and the SDK's atexit hook would
        # wait out a hung export again (30 s per processor) after close() gave up.
        self.provider = TracerProvider(resource=trace_resource(node_name, host_name),
                                       shutdown_on_exit=False)
        self._processors: list[BatchSpanProcessor] = []
        for span_exporter in span_exporters(config):
            # OTEL_BSP_* read by the processor itself (checked in trace_config_from_env).
            processor = BatchSpanProcessor(_CountingExporter(span_exporter, self))
            self._processors.append(processor)
            self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("exporter.sinks.traces", exporter.__version__)

    @classmethod
    def from_env(cls, **kwargs: Any) -> "TraceSink | None":
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

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Send what is queued and stop, within `timeout` seconds whatever the collector does;
        traces not sent by then are counted in `errors`."""
        def flush_and_shut_down() -> None:
            try:
                self.provider.force_flush(int(timeout * 1000))
                self.provider.shutdown()
            except Exception:  # noqa: BLE001 - counted below as not sent
                log.debug("trace shutdown failed", exc_info=True)

        worker = threading.Thread(target=flush_and_shut_down, name="trace-shutdown",
                                  daemon=True)  # a hung export must not keep the process
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            left = self._queued_traces()
            self.errors += max(1, left)
            log.warning("traces: the collector did not take the last traces within %.0f s; "
                        "%d not sent (counted in node_resize_exporter_sink_errors_total)",
                        timeout, max(1, left))

    def _queued_traces(self) -> int:
        """Distinct traces among the spans still queued in the batch processors."""
        traces: set[int] = set()
        for processor in self._processors:
            queue: Any = getattr(getattr(processor, "_batch_processor", None), "_queue", ())
            for span in list(queue):
                context = getattr(span, "context", None)
                if context is not None:
                    traces.add(context.trace_id)
        return len(traces)
