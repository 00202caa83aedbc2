"""Whether traces are on, and to where: the OTEL_* variables, checked at start-up.

The OTLP exporters take OTEL_EXPORTER_OTLP_[TRACES_]{ENDPOINT,HEADERS,TIMEOUT,COMPRESSION,
CERTIFICATE,...} themselves, the batch processor OTEL_BSP_*, Resource.create()
OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME. This module only decides whether traces are on
(OTEL_TRACES_EXPORTER, or an OTLP endpoint set) and which exporter class
OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL names, and checks the values the SDK would reject with a
traceback or quietly replace by its default, so a bad one exits 2 naming the variable and the fix.

Files and limits too: every OTEL_* certificate or key file must be a
readable regular file of at most FILE_MAX bytes (a gRPC exporter given /dev/zero read it whole,
2.5 GiB in 1.8 s; a FIFO hung start-up), the span limits whole numbers in range (-1 was a
traceback), and the headers what the spec's grammar allows with values an HTTP request or gRPC
metadata can carry (a junk one was a urllib3 traceback on every export).
"""
from __future__ import annotations

import math
import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping
from urllib.parse import unquote, urlparse

import exporter
from exporter.untrusted import Refused, TooLarge, read_bytes

# The OpenTelemetry SDK is imported where traces are made, not here: deciding whether they are
# on must not load it (about 6 MiB of a process that never sends a span).
if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource as OtelResource
    from opentelemetry.sdk.trace.export import SpanExporter

SERVICE_NAME = "node-resize-exporter"  # unless OTEL_SERVICE_NAME (or the attributes) say else
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
# What each OTLP exporter class accepts (the gRPC one raises on anything but gzip; the HTTP one
# logs and sends uncompressed).
COMPRESSIONS = {"http/protobuf": ("none", "gzip", "deflate"), "grpc": ("gzip",)}
# TLS files the OTLP exporters read (both protocols; the TRACES_ ones win over the others).
FILE_VARIABLES = tuple(f"OTEL_EXPORTER_OTLP_{signal}{what}" for signal in ("", "TRACES_")
                       for what in ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE"))
# A CA bundle (Debian's whole ca-certificates.crt is ~220 KB), a key or a certificate chain.
FILE_MAX = 1 << 20
# The SDK's span limits (SpanLimits): a whole number >= 0, or "unset" for no limit.
LIMIT_VARIABLES = ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
                   "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
                   "OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_SPAN_LINK_COUNT_LIMIT",
                   "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT")
LIMIT_MAX = (1 << 31) - 1
HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
# The spec's header grammar (opentelemetry.util.re, liberal: a space allowed in values).
_HEADER_KEY = re.compile(r"[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+")
_HEADER_VALUE = re.compile(r"[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*")
# What a decoded value may hold to be sent as an HTTP header and as gRPC ASCII metadata.
_SENDABLE = re.compile(r"[\x20-\x7e]*")


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
    _check_limits(env)
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
    for variable in FILE_VARIABLES:
        _check_file(env, variable)
    for variable in HEADER_VARIABLES:
        _check_headers(env, variable)
    return TraceConfig(exporters=exporters, protocol=protocol)


def _check_file(env: Mapping[str, str], name: str) -> None:
    """A TLS file the exporter will read whole: a readable regular file, not too large (read
    once through exporter/untrusted.py, which neither blocks on a FIFO nor reads /dev/zero)."""
    path = env.get(name, "").strip()
    if not path:
        return
    fix = f"set {name} to a PEM file (at most {FILE_MAX // 1024} KiB), or unset it"
    try:
        read_bytes(path, FILE_MAX)
    except TooLarge:
        raise ValueError(f"{name}={path!r}: more than {FILE_MAX} bytes; {fix}") from None
    except Refused as e:
        raise ValueError(f"{name}={path!r}: {e.reason}; {fix}") from None
    except OSError as e:
        raise ValueError(f"{name}={path!r}: {e.strerror or e}; {fix}") from None


def _check_limits(env: Mapping[str, str]) -> None:
    """The SDK raises a bare ValueError (a traceback) for a limit below 0 or not a number."""
    for name in LIMIT_VARIABLES:
        if name not in env:
            continue
        raw = env[name].strip()
        if raw.lower() == "unset":
            continue
        try:
            value: int | None = int(raw, 10)
        except ValueError:
            value = None
        if value is None or not 0 <= value <= LIMIT_MAX:
            raise ValueError(f"{name}={raw!r}: accepted values are whole numbers from 0 to "
                             f"{LIMIT_MAX}, or unset for no limit; e.g. {name}=128, or remove "
                             "the variable for the SDK's default")


def _check_headers(env: Mapping[str, str], name: str) -> None:
    """key=value pairs, comma-separated, values URL-encoded (the OTLP exporter spec); a
    decoded value must be sendable, else every export fails with a traceback."""
    raw = env.get(name, "")
    fix = (f"e.g. {name}='api-key=secret,x-tenant=a%20b' (comma-separated key=value, values "
           "URL-encoded, printable ASCII once decoded)")
    # Header values are credentials (api keys, bearer tokens): an error names the key, or
    # the item's place when the key itself is not one, never any of the text.
    for n, item in enumerate(re.split(r"[ \t]*,[ \t]*", raw.strip()), 1):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _HEADER_KEY.fullmatch(key):
            raise ValueError(f"{name}: item {n} is not a key=value header (its text is not "
                             f"shown: it may hold a credential); {fix}")
        if not _HEADER_VALUE.fullmatch(value):
            raise ValueError(f"{name}: the value of {key!r} is not URL-encoded (not shown: it "
                             f"may hold a credential); {fix}")
        decoded = unquote(value)
        if not _SENDABLE.fullmatch(decoded):
            raise ValueError(f"{name}: the value of {key!r} holds a control or non-ASCII "
                             f"character once decoded; {fix}")


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


def span_exporters(config: TraceConfig) -> list["SpanExporter"]:
    # No arguments: each exporter reads its endpoint, headers, timeout, compression and TLS
    # files from the OTEL_EXPORTER_OTLP_* variables itself (the HTTP one also appends
    # /v1/traces to a base endpoint, as the OTLP spec says).
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter
    out: list[SpanExporter] = []
    if "otlp" in config.exporters:
        if config.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
            out.append(GrpcExporter())
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )
            out.append(HttpExporter())
    if "console" in config.exporters:
        out.append(ConsoleSpanExporter())
    return out


def trace_resource(node_name: str | None = None, host_name: str | None = None) -> "OtelResource":
    """service.name, service.version, host.name and k8s.node.name, under what the user set.

    Resource.create() puts the attributes it is given over the environment's; the spec wants
    the user's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES to win over what a process says
    of itself, so the SDK's environment detector is applied once more on top.
    """
    from opentelemetry.sdk.resources import HOST_NAME, OTELResourceDetector
    from opentelemetry.sdk.resources import Resource as OtelResource
    from opentelemetry.semconv.attributes.k8s_attributes import K8S_NODE_NAME
    from opentelemetry.semconv.attributes.service_attributes import (
        SERVICE_NAME as SERVICE_NAME_KEY,
    )
    from opentelemetry.semconv.attributes.service_attributes import SERVICE_VERSION
    ours = {SERVICE_NAME_KEY: SERVICE_NAME, SERVICE_VERSION: exporter.__version__,
            HOST_NAME: host_name or socket.gethostname()}
    node = node_name or os.environ.get("NODE_NAME")
    if node:
        ours[K8S_NODE_NAME] = node
    return OtelResource.create(ours).merge(OTELResourceDetector().detect())
