"""A small HTTP image server on 127.0.0.1 (stdlib ``ThreadingHTTPServer``, ephemeral port).

It serves a fixed ``path -> bytes`` mapping with ``GET`` / ``HEAD``; anything else is 404 (unknown
path) or 405 (other methods). It binds the loopback interface only, never a public one. Used as a
context manager it starts a daemon thread on enter and shuts down cleanly on exit::

    with ImageServer({"/img/a.jpg": data}) as server:
        httpx.get(server.url("/img/a.jpg"))
"""

from __future__ import annotations

import mimetypes
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

HOST = "127.0.0.1"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, so the demo's client reuses connections

    def do_GET(self) -> None:
        self._reply(with_body=True)

    def do_HEAD(self) -> None:
        self._reply(with_body=False)

    def _reply(self, *, with_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        data = self.server.files.get(path)
        if data is None:
            body = f"404 not found: {path}\n".encode()
            self.send_response(404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        else:
            body = data
            self.send_response(200)
            self.send_header("Content-Type", mimetypes.guess_type(path)[0] or "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the demo prints its own progress


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    files: Mapping[str, bytes]


class ImageServer:
    """Serves ``files`` (server path such as ``/img/a.jpg`` -> bytes) on ``http://127.0.0.1:<port>``.

    ``port`` 0 (default) picks a free port; :attr:`port` and :meth:`url` are valid once started.
    Thread-safe for concurrent requests (one handler thread per connection). ``files`` is read,
    never modified. Raises ``OSError`` from :meth:`start` when the port cannot be bound.
    """

    def __init__(self, files: Mapping[str, bytes], port: int = 0) -> None:
        self._files = dict(files)
        self._requested_port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound TCP port. Raises ``RuntimeError`` before :meth:`start`."""
        if self._httpd is None:
            raise RuntimeError("ImageServer is not started")
        return int(self._httpd.server_address[1])

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` (e.g. ``/img/a.jpg``) on this server."""
        return f"http://{HOST}:{self.port}{path}"

    def start(self) -> ImageServer:
        """Bind 127.0.0.1 and serve on a daemon thread; returns ``self``."""
        if self._httpd is not None:
            return self
        httpd = _Server((HOST, self._requested_port), _Handler)
        httpd.files = self._files
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="demo-image-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the socket and join the thread (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ImageServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
