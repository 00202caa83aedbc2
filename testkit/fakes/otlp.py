"""Real OTLP trace receivers for tests: HTTP/protobuf and gRPC, on 127.0.0.1 only.

Each decodes ExportTraceServiceRequest with opentelemetry-proto and keeps the spans, flattened,
so tests can assert the span tree an exporter really sent over the wire.
"""
from __future__ import annotations

import gzip
import threading
import time
import zlib
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def any_value(v: AnyValue):
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def attributes(kvs) -> dict:
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass
class ReceivedSpan:
    name: str
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    start_ns: int
    end_ns: int
    attributes: dict
    events: list[tuple[str, int, dict]]
    status_code: int
    status_message: str
    resource: dict


@dataclass
class Received:
    requests: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest, headers: dict) -> None:
        spans = []
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(ReceivedSpan(
                        name=s.name, trace_id=s.trace_id, span_id=s.span_id,
                        parent_span_id=s.parent_span_id, start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano, attributes=attributes(s.attributes),
                        events=[(e.name, e.time_unix_nano, attributes(e.attributes))
                                for e in s.events],
                        status_code=s.status.code, status_message=s.status.message,
                        resource=resource))
        with self.lock:
            self.requests += 1
            self.spans.extend(spans)
            self.headers.append(headers)

    def wait_spans(self, n: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= n:
                    return list(self.spans)
            time.sleep(0.02)
        raise AssertionError(f"expected {n} spans, got {len(self.spans)}")


class HttpReceiver:
    """OTLP/HTTP protobuf receiver: POST /v1/traces."""

    def __init__(self, junk_header: bool = False) -> None:
        """`junk_header`: answer 200 with a header line that is not one (a broken proxy in
        front of the collector): urllib3 cannot parse the answer's headers."""
        self.received = Received()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                received.add(request, {k.lower(): v for k, v in self.headers.items()})
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                if junk_header:
                    self._headers_buffer.append(b"this line is no header\r\n")
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "HttpReceiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC receiver (opentelemetry.proto.collector.trace.v1.TraceService/Export)."""

    def __init__(self) -> None:
        self.received = Received()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def Export(self, request, context):  # noqa: N802 (the proto's naming)
        self.received.add(request, dict(context.invocation_metadata()))
        return trace_service_pb2.ExportTraceServiceResponse()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "GrpcReceiver":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(grace=None).wait(5)
