"""imaging.download against real HTTP/1.1 servers on 127.0.0.1: the pooled client, one total
deadline, redirects, the private-address guard, data: URLs and secrets."""

from __future__ import annotations

import base64
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import pytest
from opentelemetry.trace import StatusCode

from otel_stages import imaging, semconv, transport
from tests.conftest import DATA

PHOTO = (DATA / "images" / "photo_320x240.jpg").read_bytes()

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


@dataclass
class Server:
    base: str
    host: str
    port: int
    connections: list[tuple[str, int]] = field(default_factory=list)  # one per TCP connection
    requests: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


def _send(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes = b"",
          headers: dict[str, str] | None = None) -> None:
    handler.send_response(status)
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextmanager
def serve(routes: dict[str, Route], host: str = "127.0.0.1") -> Iterator[Server]:
    """A keep-alive HTTP/1.1 server; ``routes`` map a path to a handler function."""
    state: dict[str, Server] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            state["server"].connections.append(self.client_address)

        def do_GET(self):
            server = state["server"]
            server.requests.append(self.path)
            route = routes.get(self.path.split("?", 1)[0])
            try:
                if route is None:
                    _send(self, 404, b"no such image")
                else:
                    route(self)
            except (ConnectionError, OSError):
                pass  # the client gave up (deadline tests)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
    httpd.daemon_threads = True
    port = httpd.server_address[1]
    state["server"] = server = Server(f"http://{host}:{port}", host, port)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        httpd.shutdown()
        httpd.server_close()


def photo(handler):
    _send(handler, 200, PHOTO, {"Content-Type": "image/jpeg; charset=binary"})


def redirect_to(location: str) -> Route:
    return lambda handler: _send(handler, 302, b"moved", {"Location": location})


@pytest.fixture(autouse=True)
def fresh_shared_clients():
    transport.close_shared()
    yield
    transport.close_shared()


# --- 1. do not distort: one pooled client, built outside the span ------------------------------

def test_pooled_client_reuses_one_connection_across_calls_and_threads(captured):
    with serve({"/p.jpg": photo}) as server:
        for _ in range(5):
            assert imaging.download(f"{server.base}/p.jpg") == PHOTO
        assert len(server.connections) == 1  # one keep-alive connection for all five
        results: list[bytes] = []
        threads = [threading.Thread(target=lambda: results.append(imaging.download(f"{server.base}/p.jpg")))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [PHOTO] * 4
    assert len(server.connections) <= 1 + 4  # sequential calls share one; concurrent ones may add
    assert len(server.requests) == 9
    first = transport.shared_client()
    assert transport.shared_client() is first  # one per process


def test_a_plain_client_per_call_would_open_a_connection_each_time(captured):
    """The contrast the pooled default removes: every new client is a new TCP connection."""
    with serve({"/p.jpg": photo}) as server:
        for _ in range(3):
            with httpx.Client() as client:
                imaging.download(f"{server.base}/p.jpg", client=client)
    assert len(server.connections) == 3


def test_client_construction_is_not_inside_the_download_span(captured_fake_clock, monkeypatch):
    captured, fake_time = captured_fake_clock
    built: list[httpx.Client] = []
    real = transport.http_client

    def slow_build(**kwargs):
        fake_time.advance_ms(40)  # building a client costs 20-50 ms on a busy host
        built.append(real(**kwargs))
        return built[-1]

    monkeypatch.setattr(transport, "http_client", slow_build)
    with serve({"/p.jpg": photo}) as server:
        imaging.download(f"{server.base}/p.jpg")
        imaging.download(f"{server.base}/p.jpg")
    assert len(built) == 1
    durations = [s.end_time - s.start_time for s in captured.by_name("download")]
    assert durations == [0, 0]  # the fake span clock only moved while the client was built


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_builds_its_own_pooled_client(captured):
    with serve({"/p.jpg": photo}) as server:
        imaging.download(f"{server.base}/p.jpg")
        parent_client = id(transport.shared_client())
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read_fd)
                data = imaging.download(f"{server.base}/p.jpg")
                os.write(write_fd, json.dumps({"ok": data == PHOTO,
                                               "client": id(transport.shared_client())}).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            child = json.loads(pipe.read())
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child["ok"]
    assert len(server.connections) == 2  # the child did not write into the parent's connection
    assert parent_client == id(transport.shared_client())


# --- one total deadline -------------------------------------------------------------------------

@contextmanager
def dripping() -> Iterator[Server]:
    def headers(handler):
        for ch in b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Slow: " + b"a" * 12 + b"\r\n\r\nabc":
            if server.release.wait(0.025):  # each read is quick; the whole takes ~1.5 s
                return
            handler.wfile.write(bytes([ch]))
            handler.wfile.flush()

    def body(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        for _ in range(100000):
            if server.release.wait(0.1):
                return
            handler.wfile.write(b"x")
            handler.wfile.flush()

    with serve({"/drip-headers": headers, "/drip": body}) as server:
        yield server


@pytest.mark.parametrize("path", ["/drip", "/drip-headers"])
def test_pooled_client_deadline_covers_dripping_headers_and_body(path, captured):
    with dripping() as server:
        started = time.monotonic()
        with pytest.raises(imaging.DownloadError, match=r"timed out after 0.4 s$"):
            imaging.download(f"{server.base}{path}", timeout_s=0.4)
        assert time.monotonic() - started < 1.5  # not 0.1 s per byte until done
    span = captured.one("download")
    assert span.status.status_code is StatusCode.ERROR


def test_own_client_deadline_says_what_it_could_not_bound(captured):
    with dripping() as server, httpx.Client() as client:
        with pytest.raises(imaging.DownloadError) as info:
            imaging.download(f"{server.base}/drip-headers", client=client, timeout_s=0.3)
    message = str(info.value)
    assert "timed out after 0.3 s" in message
    assert "not DNS or slowly sent headers" in message and "imaging.http_client()" in message


def test_dns_lookup_counts_against_the_deadline(captured, monkeypatch):
    real = socket.getaddrinfo
    gate = threading.Event()

    def slow_dns(host, *args, **kwargs):
        if host == "slow-dns.test":
            gate.wait(10)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_dns)
    started = time.monotonic()
    try:
        with pytest.raises(imaging.DownloadError, match="timed out after 0.3 s"):
            imaging.download("http://slow-dns.test/p.jpg", timeout_s=0.3)
    finally:
        gate.set()
    assert time.monotonic() - started < 2


# --- redirects ----------------------------------------------------------------------------------

def test_redirects_are_followed_and_the_final_host_recorded(captured):
    with serve({"/p.jpg": photo}, host="127.0.0.1") as target:
        other = f"http://localhost:{target.port}/p.jpg"  # same server, another host name
        with serve({"/same": redirect_to("/hop"), "/hop": redirect_to(other)}) as origin:
            assert imaging.download(f"{origin.base}/same") == PHOTO
    span = captured.one("download")
    assert span.attributes[semconv.SERVER_ADDRESS] == "localhost"
    assert span.attributes[semconv.HTTP_REQUEST_RESEND_COUNT] == 2
    assert span.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert span.attributes[semconv.IMAGE_MEDIA_TYPE] == "image/jpeg"
    assert span.attributes[semconv.URL_FULL] == f"{origin.base}/same"


def test_cross_host_redirect_refused_when_not_allowed_same_host_still_followed(captured):
    with serve({"/p.jpg": photo}) as target:
        with serve({"/away": redirect_to(f"http://localhost:{target.port}/p.jpg"),
                    "/near": redirect_to(f"{target.base}/p.jpg".replace(str(target.port), "{port}")),
                    "/local": redirect_to("/p.jpg"), "/p.jpg": photo}) as origin:
            with pytest.raises(imaging.DownloadError,
                               match=r"redirect from host 127.0.0.1 to host localhost refused \(cross_host_redirects=False\)"):
                imaging.download(f"{origin.base}/away", cross_host_redirects=False)
            assert imaging.download(f"{origin.base}/local", cross_host_redirects=False) == PHOTO
            assert imaging.download(f"{origin.base}/away") == PHOTO  # allowed by default
    assert len(target.requests) == 1  # the refused redirect was never fetched


def test_redirect_loops_and_unfollowed_redirects_fail_clearly(captured):
    with serve({"/loop": redirect_to("/loop"), "/p.jpg": photo, "/moved": redirect_to("/p.jpg"),
                "/file": redirect_to("file:///etc/passwd")}) as server:
        with pytest.raises(imaging.DownloadError, match="more than max_redirects=3 redirects"):
            imaging.download(f"{server.base}/loop", max_redirects=3)
        with pytest.raises(imaging.DownloadError, match=r"HTTP 302 Found \(redirect not followed\)"):
            imaging.download(f"{server.base}/moved", follow_redirects=False)
        with httpx.Client(follow_redirects=False) as client:  # a plain client's own choice holds
            with pytest.raises(imaging.DownloadError, match="HTTP 302"):
                imaging.download(f"{server.base}/moved", client=client)
        with pytest.raises(imaging.DownloadError, match="redirect to a file: URL refused"):
            imaging.download(f"{server.base}/file")
    assert server.requests.count("/loop") == 4


# --- the private-address guard ----------------------------------------------------------------

def test_guard_refuses_loopback_by_default_and_names_the_address(captured):
    with serve({"/p.jpg": photo}) as server:
        with pytest.raises(imaging.DownloadError, match=r"refused: 127.0.0.1 resolves to 127.0.0.1"):
            imaging.download(f"{server.base}/p.jpg", block_private=True)
        with pytest.raises(imaging.DownloadError, match="refused: localhost resolves to"):
            imaging.download(f"http://localhost:{server.port}/p.jpg", block_private=True)
        assert imaging.download(f"{server.base}/p.jpg") == PHOTO  # the guard is opt-in
    assert server.requests == ["/p.jpg"]  # the refused ones never connected


@pytest.mark.parametrize("address, blocked", [
    ("10.1.2.3", True), ("172.16.0.1", True), ("192.168.1.1", True), ("127.0.0.1", True),
    ("169.254.169.254", True), ("100.64.0.1", True), ("0.0.0.0", True), ("::1", True),
    ("fe80::1", True), ("fc00::1", True), ("::ffff:10.0.0.1", True), ("224.0.0.1", True),
    ("8.8.8.8", False), ("2606:4700:4700::1111", False), ("::ffff:8.8.8.8", False),
])
def test_address_rule(address, blocked):
    assert transport.is_blocked(address) is blocked


def test_guard_checks_the_resolved_address_of_every_hop(captured, monkeypatch):
    """First hop allowed, the redirect's host resolves to a blocked address: refused at connect."""
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real(
        "127.0.0.2" if host == "internal.test" else host, *a, **k))
    with serve({"/p.jpg": photo}, host="127.0.0.2") as internal:
        with serve({"/go": redirect_to(f"http://internal.test:{internal.port}/p.jpg")}) as public:
            backend = transport.DeadlineBackend(block_private=True, blocked=lambda a: a == "127.0.0.2")
            with httpx.Client(transport=transport._Transport(backend)) as client:
                with pytest.raises(imaging.DownloadError,
                                   match="refused: internal.test resolves to 127.0.0.2"):
                    imaging.download(f"{public.base}/go", client=client, block_private=True)
    assert public.requests == ["/go"] and internal.requests == []


def test_guard_cannot_be_asked_of_a_plain_client():
    with httpx.Client() as client, pytest.raises(ValueError, match="block_private=True needs"):
        imaging.download("http://example.test/p.jpg", client=client, block_private=True)


# --- data: URLs ---------------------------------------------------------------------------------

def test_data_url_is_decoded_locally_and_recorded_as_a_summary(captured):
    payload = base64.b64encode(PHOTO).decode()
    url = f"data:image/jpeg;base64,{payload}"
    assert imaging.download(url) == PHOTO
    span = captured.one("download")
    assert span.attributes[semconv.URL_FULL] == f"data:image/jpeg;base64,[{len(payload)} chars]"
    assert span.attributes[semconv.URL_SCHEME] == "data"
    assert span.attributes[semconv.IMAGE_MEDIA_TYPE] == "image/jpeg"
    assert span.attributes[semconv.IMAGE_SIZE] == len(PHOTO)


def _span_text(span) -> int:
    parts = [str(v) for v in span.attributes.values()] + [span.status.description or ""]
    parts += [str(v) for e in span.events for v in e.attributes.values()]
    return sum(len(p) for p in parts)


def test_a_failed_two_megabyte_data_url_stays_small_in_telemetry(captured):
    url = "data:image/png;base64," + "A" * 1_999_999 + "*"  # not base64 at the very end
    with pytest.raises(imaging.DownloadError, match=r"not valid base64") as info:
        imaging.download(url)
    assert len(str(info.value)) < 200 and "AAAA" not in str(info.value)
    span = captured.one("download")
    assert span.attributes[semconv.URL_FULL] == "data:image/png;base64,[2000000 chars]"
    assert _span_text(span) < 10_000
    with pytest.raises(imaging.DownloadError, match="exceeds max_bytes=1000"):
        imaging.download("data:image/png;base64," + "A" * 4000, max_bytes=1000)
    with pytest.raises(imaging.DownloadError, match="without a ','"):
        imaging.download("data:image/png;base64")


# --- secrets ------------------------------------------------------------------------------------

SECRETS = ("tok3n-value", "acc3ss-value", "k3y-value", "g00g-credential", "p4ss-word", "s3cr3t-id")


def _assert_no_secret(captured, error: BaseException) -> None:
    texts = [str(error), repr(error.__cause__)]
    for span in captured.spans:
        texts += [str(dict(span.attributes)), span.status.description or ""]
        texts += [str(dict(e.attributes)) for e in span.events]
    for secret in SECRETS:
        assert all(secret not in t for t in texts), secret


def test_bearer_names_are_redacted_from_url_error_and_exception_event(captured):
    query = ("token=tok3n-value&access_token=acc3ss-value&api_key=k3y-value"
             "&X-Goog-Credential=g00g-credential&size=large")
    with serve({}) as server:
        host = server.base.removeprefix("http://")
        url = f"http://user:p4ss-word@{host}/missing.jpg?{query}#client_secret=s3cr3t-id"
        with pytest.raises(imaging.DownloadError) as info:
            imaging.download(url)
    _assert_no_secret(captured, info.value)
    shown = captured.one("download").attributes[semconv.URL_FULL]
    assert shown == (f"http://REDACTED:REDACTED@{host}/missing.jpg?token=REDACTED&access_token=REDACTED"
                     "&api_key=REDACTED&X-Goog-Credential=REDACTED&size=large#client_secret=REDACTED")


def test_secrets_stay_out_of_transport_errors_and_unparsable_urls(captured):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens
    for url in (f"http://127.0.0.1:{port}/p.jpg?token=tok3n-value",
                "http://[::1/p.jpg?api_key=k3y-value&access_token=acc3ss-value",
                "http://user:p4ss-word@[::1/x"):
        with pytest.raises(imaging.DownloadError) as info:
            imaging.download(url, timeout_s=2)
        _assert_no_secret(captured, info.value)
    assert "ConnectError" in str(info.value) or "InvalidURL" in str(info.value)


def test_configured_extra_keys_are_redacted_too():
    from otel_stages import urls

    try:
        urls.set_extra_sensitive_keys(("session_hint",))
        assert urls.redact_url("https://a.test/x?session_hint=abc&q=1") == \
            "https://a.test/x?session_hint=REDACTED&q=1"
    finally:
        urls.set_extra_sensitive_keys(())
    assert urls.redact_url("https://a.test/x?session_hint=abc") == "https://a.test/x?session_hint=abc"


def test_download_benchmark_smoke(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "download.py"
    spec = importlib.util.spec_from_file_location("download_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--smoke"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["span_median_ms"]) == {"per_call_client", "pooled_default", "prebuilt_client"}
    assert report["requests_per_variant"] == 6
