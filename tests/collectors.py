"""Collector stand-ins on 127.0.0.1 for delivery tests: one that accepts connections and never
answers (a black hole, for OTLP/HTTP and OTLP/gRPC alike: the gRPC client never gets the HTTP/2
settings frame), a port where nothing listens (connection refused), and a real OTLP/HTTP receiver
that takes its time on traces (a slow collector)."""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.otlp_receiver import Received


@contextmanager
def black_hole() -> Iterator[str]:
    """``http://127.0.0.1:<port>``: accepts every connection, reads, never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)  # kept open, never read from or written to

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


def closed_port() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens (the port was bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def slow_http_receiver(traces_delay_s: float) -> Iterator[tuple[str, Received]]:
    """A real OTLP/HTTP receiver that answers ``/v1/traces`` only after ``traces_delay_s``
    (metrics at once); ``received`` holds what arrived."""
    received = Received()
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                release.wait(traces_delay_s)
                received.traces.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            else:
                received.metrics.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def spans_received(received: Received) -> int:
    return sum(len(ss.spans) for req in received.traces for rs in req.resource_spans
               for ss in rs.scope_spans)


def wait_until(predicate, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` (for a server-side effect that has no flush to call)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
