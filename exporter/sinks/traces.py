"""One OpenTelemetry trace per episode, built when the episode ends.

Spans carry the episode's own times (kernel CLOCK_MONOTONIC already converted to wall time once,
at the source), never the time this code runs: a trace built minutes after the fact, or after a
restart that resumed the episode, still shows when the kernel and the kubelet really acted.

Configured by the standard OTEL_* variables, which the SDK reads itself: the OTLP exporters take
OTEL_EXPORTER_OTLP_[TRACES_]{ENDPOINT,HEADERS,TIMEOUT,COMPRESSION,CERTIFICATE,...}, the batch
processor OTEL_BSP_*, Resource.create() OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME. This
module only decides whether traces are on (OTEL_TRACES_EXPORTER, or an OTLP endpoint set) and
which exporter class OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL names, and checks at start-up the
values the SDK would reject with a traceback or quietly replace by its default, so a bad one
exits 2 naming the variable and the fix. Each episode is exported once: the journal's exported
flag survives a restart, so a resumed episode is not traced twice.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import threading
from dataclasses import dataclass
from typing import Mapping, Protocol
from urllib.parse import urlparse

from opentelemetry import trace
from opentelemetry.sdk.resources import HOST_NAME, OTELResourceDetector
from opentelemetry.sdk.resources import Resource as OtelResource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, ConsoleSpanExporter,
                                            SpanExporter, SpanExportResult)
from opentelemetry.semconv.attributes.k8s_attributes import K8S_NODE_NAME
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME as SERVICE_NAME_KEY
from opentelemetry.semconv.attributes.service_attributes import SERVICE_VERSION
from opentelemetry.trace import Status, StatusCode

import exporter
from exporter.correlate.model import Episode, EpisodeUpdate, Outcome, UpdateKind
from exporter.events import Event, Resource, Transition

log = logging.getLogger("exporter.sinks.traces")

SERVICE_NAME = "node-resize-exporter"  # unless OTEL_SERVICE_NAME (or the attributes) say else
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
# What each OTLP exporter class accepts (the gRPC one raises on anything but gzip; the HTTP one
# logs and sends uncompressed).
COMPRESSIONS = {"http/protobuf": ("none", "gzip", "deflate"), "grpc": ("gzip",)}
# Outcomes that are not a problem: the root span's status stays unset for them.
GOOD_OUTCOMES = {Outcome.CONVERGED, Outcome.KERNEL_ONLY}


class ExportedFlag(Protocol):
    """What the trace sink needs from the journal (exporter.sinks.journal.Journal)."""

    def is_exported(self, episode_id: str) -> bool: ...

    def mark_exported(self, episode_id: str) -> None: ...


@dataclass(frozen=True)
class TraceConfig:
    exporters: tuple[str, ...]  # "otlp" and/or "console"
    protocol: str = "http/protobuf"  # which OTLP exporter class; it reads the rest itself


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def trace_config_from_env() -> TraceConfig | None:
    """The trace configuration the OTEL_* variables ask for; None when traces are off.

    Raises ValueError naming the variable and the accepted values for a bad setting.
    """
    env = os.environ  # the SDK reads os.environ, so the checks must read the same
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = _first(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    names = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if names:
        chosen = tuple(n.strip().lower() for n in names.split(",") if n.strip())
        bad = [n for n in chosen if n not in EXPORTERS]
        if bad or not chosen:
            raise ValueError(f"OTEL_TRACES_EXPORTER={names!r}: accepted values are "
                             f"{', '.join(EXPORTERS)} (comma-separated)")
        exporters = tuple(n for n in dict.fromkeys(chosen) if n != "none")
    elif endpoint:
        exporters = ("otlp",)
    else:
        return None  # nothing asked for traces
    if not exporters:
        return None
    _check_batch_processor(env)
    if "otlp" not in exporters:
        return TraceConfig(exporters=exporters)

    proto = _first(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = "http/protobuf"
    if proto:
        protocol = proto[1].lower()
        if protocol not in PROTOCOLS:
            raise ValueError(f"{proto[0]}={proto[1]!r}: accepted values are "
                             f"{', '.join(PROTOCOLS)}")
    if endpoint is not None:
        name, url = endpoint
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"{name}={url!r}: accepted values are http:// or https:// URLs "
                             "with a host, e.g. http://otel-collector:4318")
    _check_exporter(env, protocol)
    return TraceConfig(exporters=exporters, protocol=protocol)


def _check_batch_processor(env: Mapping[str, str]) -> None:
    """OTEL_BSP_*: the SDK raises a bare ValueError for a value under 1 (after the privilege
    drop, as a traceback) and logs a traceback and uses its default for a non-integer."""
    _integer(env, "OTEL_BSP_SCHEDULE_DELAY", low=1, default=5000,
             unit="milliseconds between exports",
             # threading's wait() raises OverflowError past TIMEOUT_MAX, in the worker thread
             high=int(threading.TIMEOUT_MAX * 1000))
    queue = _integer(env, "OTEL_BSP_MAX_QUEUE_SIZE", low=1, default=2048, unit="spans held")
    batch = _integer(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", low=1, default=512,
                     unit="spans per export")
    _integer(env, "OTEL_BSP_EXPORT_TIMEOUT", low=0, default=30000, unit="milliseconds")
    if batch > queue:
        raise ValueError(f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE={batch}: must be at most "
                         f"OTEL_BSP_MAX_QUEUE_SIZE ({queue}); lower it or raise the queue size")


def _integer(env: Mapping[str, str], name: str, *, low: int, default: int, unit: str,
             high: int | None = None) -> int:
    """The variable's whole number (the SDK's default when unset); ValueError naming it."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value: int | None = int(raw, 10)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        upper = f" and at most {high}" if high is not None else ""
        raise ValueError(f"{name}={raw!r}: accepted values are whole numbers of at least "
                         f"{low}{upper} ({unit}; unset means {default}), "
                         f"e.g. {name}={default}")
    return value


def _check_exporter(env: Mapping[str, str], protocol: str) -> None:
    """Values the OTLP exporter classes would raise on (gRPC) or silently replace (HTTP)."""
    timeout = _first(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    if timeout is not None:
        name, raw = timeout
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"{name}={raw!r}: accepted values are a number of seconds more "
                             f"than 0 (the Python SDK reads seconds), e.g. {name}=10")
    compression = _first(env, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
                         "OTEL_EXPORTER_OTLP_COMPRESSION")
    if compression is not None:
        name, raw = compression
        accepted = COMPRESSIONS[protocol]
        if raw.lower() not in accepted:
            raise ValueError(f"{name}={raw!r}: accepted values with protocol {protocol} are "
                             f"{', '.join(accepted)} (or leave it unset for none)")


def _span_exporters(config: TraceConfig) -> list[SpanExporter]:
    # No arguments: each exporter reads its endpoint, headers, timeout, compression and TLS
    # files from the OTEL_EXPORTER_OTLP_* variables itself (the HTTP one also appends
    # /v1/traces to a base endpoint, as the OTLP spec says).
    out: list[SpanExporter] = []
    if "otlp" in config.exporters:
        if config.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter)
            out.append(GrpcExporter())
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter)
            out.append(HttpExporter())
    if "console" in config.exporters:
        out.append(ConsoleSpanExporter())
    return out


def trace_resource(node_name: str | None = None, host_name: str | None = None) -> OtelResource:
    """service.name, service.version, host.name and k8s.node.name, under what the user set.

    Resource.create() puts the attributes it is given over the environment's; the spec wants
    the user's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES to win over what a process says
    of itself, so the SDK's environment detector is applied once more on top.
    """
    ours = {SERVICE_NAME_KEY: SERVICE_NAME, SERVICE_VERSION: exporter.__version__,
            HOST_NAME: host_name or socket.gethostname()}
    node = node_name or os.environ.get("NODE_NAME")
    if node:
        ours[K8S_NODE_NAME] = node
    return OtelResource.create(ours).merge(OTELResourceDetector().detect())


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


def _ns(t: float) -> int:
    return int(round(t * 1e9))


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
        for span_exporter in _span_exporters(config):
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


# ---------------------------------------------------------------- the span tree


def episode_end(ep: Episode) -> float:
    """The root span's end: `ended`, else the latest time the episode knows."""
    if ep.ended is not None:
        return ep.ended
    times = [ep.opened, ep.kernel_done, ep.resynced, ep.readmission_settled,
             *(t.end for t in ep.transitions), *(p.time for p in ep.pods)]
    return max(t for t in times if t is not None)


def _set_error(span: trace.Span, description: str) -> None:
    span.set_status(Status(StatusCode.ERROR, description))


def _capacity_attrs(prefix: str, before: float | None, after: float | None) -> dict:
    out = {}
    if before is not None:
        out[f"{prefix}.before"] = before
    if after is not None:
        out[f"{prefix}.after"] = after
    return out


def transition_attributes(t: Transition) -> dict:
    attrs: dict = {"hotplug.source": t.source, "hotplug.resource": t.resource.value,
                   "hotplug.direction": t.direction.value, "hotplug.result": t.result.value}
    if t.resource is Resource.CPU:
        attrs["hotplug.cpu.id"] = t.unit
    else:
        attrs["hotplug.memory.block"] = t.unit
    optional = {"hotplug.duration_s": t.duration, "hotplug.steps": t.steps,
                "hotplug.cpuhp.failed_state": t.failed_state, "hotplug.error": t.error,
                "hotplug.memory.pfn": t.pfn, "hotplug.memory.nr_pages": t.nr_pages}
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def build_trace(tracer: trace.Tracer, ep: Episode) -> None:
    """Emit the episode's spans (root, kernel transitions, resync, readmission)."""
    end = episode_end(ep)
    root_attrs = {
        "node_resize.episode.id": ep.id, "node_resize.resource": ep.resource.value,
        "node_resize.change": ep.change.value,
        "node_resize.outcome": ep.outcome.value if ep.outcome else "open",
        "node_resize.transitions": len(ep.transitions),
        **_capacity_attrs("node_resize.kernel.capacity", ep.kernel_before, ep.kernel_after),
        **_capacity_attrs("node_resize.kubelet.capacity", ep.kubelet_before, ep.kubelet_after),
    }
    for key, value in (("node_resize.detail", ep.detail or None),
                       ("node_resize.kernel.seconds", ep.kernel_seconds),
                       ("node_resize.resync.seconds", ep.resync_seconds),
                       ("node_resize.readmission.seconds", ep.readmission_seconds)):
        if value is not None:
            root_attrs[key] = value
    root = tracer.start_span(f"episode {ep.resource.value} {ep.change.value}",
                             attributes=root_attrs, start_time=_ns(ep.opened))
    if ep.outcome is not None and ep.outcome not in GOOD_OUTCOMES:
        _set_error(root, ep.detail or ep.outcome.value)
    ctx = trace.set_span_in_context(root)

    for t in ep.transitions:
        start = t.start if t.start is not None else t.end  # uevent/sysfs: only the end is known
        span = tracer.start_span("kernel.transition", context=ctx,
                                 attributes=transition_attributes(t), start_time=_ns(start))
        if t.result.value == "failed":
            what = t.error or (f"cpuhp state {t.failed_state}" if t.failed_state else "failed")
            _set_error(span, what)
        span.end(end_time=_ns(t.end))

    judged = ep.outcome not in (Outcome.KERNEL_ONLY, Outcome.KERNEL_FAILED)
    if ep.kernel_done is not None and (ep.resynced is not None or judged):
        resync_end = ep.resynced if ep.resynced is not None else end
        attrs = {"node_resize.resynced": ep.resynced is not None,
                 **({"node_resize.resynced_by": ep.resynced_by} if ep.resynced_by else {}),
                 **_capacity_attrs("kubelet.capacity", ep.kubelet_before, ep.kubelet_after)}
        if ep.kernel_after is not None:
            attrs["kernel.capacity"] = ep.kernel_after
        span = tracer.start_span("kubelet.resync", context=ctx, attributes=attrs,
                                 start_time=_ns(ep.kernel_done))
        if ep.outcome in (Outcome.RESYNC_TIMEOUT, Outcome.MISMATCH):
            _set_error(span, ep.outcome.value)
        span.end(end_time=_ns(max(resync_end, ep.kernel_done)))

    if ep.readmission_settled is not None or ep.pods:
        start = ep.resynced if ep.resynced is not None else (ep.kernel_done or ep.opened)
        settled = ep.readmission_settled if ep.readmission_settled is not None else end
        rejected = sum(1 for p in ep.pods if p.outcome.value == "rejected")
        span = tracer.start_span("kubelet.readmission", context=ctx, start_time=_ns(start),
                                 attributes={"node_resize.pods.rejected": rejected,
                                             "node_resize.pods.kept": len(ep.pods) - rejected})
        for p in ep.pods:
            span.add_event(f"pod.{p.outcome.value}", timestamp=_ns(p.time), attributes={
                "k8s.pod.name": p.name, "k8s.namespace.name": p.namespace, "k8s.pod.uid": p.uid,
                "node_resize.pod.outcome": p.outcome.value, "node_resize.pod.reason": p.reason})
        if rejected:
            _set_error(span, f"{rejected} pod(s) rejected at readmission")
        span.end(end_time=_ns(max(settled, start)))

    root.end(end_time=_ns(max(end, ep.opened)))
