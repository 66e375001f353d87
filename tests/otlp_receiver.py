"""OTLP receivers the tests control: real HTTP (protobuf) and gRPC servers on 127.0.0.1:0.

Each context manager yields ``(endpoint, received)``: the base URL to export to
(``http://127.0.0.1:<port>``) and a :class:`Received` that collects every decoded
``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` (gzip bodies and gRPC compression
included) and the ``User-Agent`` of each export call. Used by ``test_export.py`` (the SDK straight
to a receiver) and ``test_rotel_e2e.py`` (the SDK through a real collector to a receiver).
"""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Received:
    """What a receiver got, in arrival order."""

    def __init__(self) -> None:
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.user_agents: list[str] = []  # one per export call (HTTP header / gRPC metadata)

    def span_names(self) -> set[str]:
        return {s.name for req in self.traces for rs in req.resource_spans
                for ss in rs.scope_spans for s in ss.spans}

    def metric_names(self) -> set[str]:
        return {m.name for req in self.metrics for rm in req.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}


@contextmanager
def http_receiver() -> Iterator[tuple[str, Received]]:
    """OTLP/HTTP protobuf on ``/v1/traces`` and ``/v1/metrics``; 404 elsewhere."""
    received = Received()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.headers["Content-Type"] == "application/x-protobuf"
            if self.path == "/v1/traces":
                received.traces.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                reply = trace_service_pb2.ExportTraceServiceResponse()
            elif self.path == "/v1/metrics":
                received.metrics.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
                reply = metrics_service_pb2.ExportMetricsServiceResponse()
            else:
                self.send_error(404)
                return
            received.user_agents.append(self.headers.get("User-Agent", ""))
            payload = reply.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    """OTLP/gRPC TraceService and MetricsService, plaintext."""
    received = Received()

    def user_agent(context) -> str:  # type: ignore[no-untyped-def]
        return dict(context.invocation_metadata()).get("user-agent", "")

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            received.traces.append(request)
            received.user_agents.append(user_agent(context))
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):
            received.metrics.append(request)
            received.user_agents.append(user_agent(context))
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(None)
