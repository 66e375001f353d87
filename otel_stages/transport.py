"""HTTP clients for :func:`otel_stages.imaging.download`: pooled, deadline-bounded, optionally
refusing private addresses.

* :func:`shared_client` returns one ``httpx.Client`` per process and address policy, built on
  first use and re-created in a forked child (its connections belong to the parent). It is
  thread-safe (httpx clients are) and keeps connections alive, so a download costs the transfer,
  not a new client, TLS context and TCP handshake each time (building an ``httpx.Client`` takes
  20-50 ms: more than fetching a small image over a LAN).
* Clients from :func:`http_client` (the shared ones included) read and write through a
  :class:`DeadlineBackend`, an ``httpcore`` network backend: every connect, DNS lookup, read and
  write is bounded by the *remaining* time of the download that runs it (:func:`deadline`), so a
  server that drips headers or body bytes, or a DNS server that never answers, cannot hold a
  download past its ``timeout_s``. (``httpx`` timeouts bound each operation, not the total.)
* With ``block_private=True`` the backend resolves each host itself, refuses the connection when
  any resolved address is not globally routable (private, loopback, link-local, CGNAT, reserved,
  multicast; IPv4-mapped IPv6 included) and connects to the checked address, so a DNS answer
  cannot change between check and connect. Every redirect hop opens its own connection through
  the same check; guarded and unguarded downloads never share a pool.

The built-in clients connect directly: they do not read ``HTTP(S)_PROXY``; build one with
``http_client(proxy=...)`` when images must go through a proxy.

Why a network backend: ``httpx`` exposes no total deadline and no connect-time address hook;
``httpcore``'s public ``network_backend=`` parameter is the layer where both can be enforced.
``httpx.HTTPTransport`` takes no backend, so :class:`_Transport` builds the ``httpcore`` pool
itself (one private ``httpx`` attribute, ``_pool``, the pool the transport sends through).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import ipaddress
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

logger = logging.getLogger("otel_stages")

#: The remaining-time budget of the download running in this context: a ``time.monotonic()``
#: deadline, or ``None`` (no total deadline).
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("otel_stages_deadline",
                                                                        default=None)
_DNS_THREADS = 4  # concurrent lookups; more wait in the queue, each still bounded by its deadline
_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class BlockedAddress(httpcore.ConnectError):
    """The host resolved to an address the download's policy refuses (``block_private``)."""


@contextmanager
def deadline(at_monotonic_s: float) -> Iterator[None]:
    """Bound every network operation of clients from :func:`http_client` inside the block by
    ``at_monotonic_s`` (a ``time.monotonic()`` value)."""
    token = _DEADLINE.set(at_monotonic_s)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _budget(timeout: float | None, error: type[Exception], what: str) -> float | None:
    """``timeout`` shortened to the time left before the current deadline; raises ``error``
    when it has passed."""
    at = _DEADLINE.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error(f"deadline passed before {what}")
    return left if timeout is None else min(timeout, left)


def is_blocked(address: str) -> bool:
    """True for addresses a guarded download refuses: anything not globally routable
    (``ipaddress``'s ``is_global`` is false: private, loopback, link-local, shared/CGNAT,
    reserved, documentation, unspecified) and multicast. IPv4-mapped IPv6 is judged as IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


class _Resolver:
    """``getaddrinfo`` with a timeout: lookups run on a few daemon threads (the call itself has
    no timeout); a lookup still running at the deadline is abandoned, not waited for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def reset(self) -> None:
        """Forget the thread pool (its threads do not exist in a forked child)."""
        self._lock = threading.Lock()
        self._pool = None

    def resolve(self, host: str, port: int, timeout: float | None) -> list[str]:
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
            return [host]  # a literal address: nothing to look up
        except ValueError:
            pass
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    _DNS_THREADS, thread_name_prefix="otel-stages-dns")
            pool = self._pool
        future = pool.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            infos = future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise httpcore.ConnectTimeout(f"DNS lookup of {host} did not finish in time") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"DNS lookup of {host} failed: {exc}") from None
        seen: list[str] = []
        for info in infos:
            address = str(info[4][0])
            if address not in seen:
                seen.append(address)
        return seen


_RESOLVER = _Resolver()


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose reads and writes end by the current download's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _budget(timeout, httpcore.ReadTimeout, "reading"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _budget(timeout, httpcore.WriteTimeout, "writing"))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname,
                                      _budget(timeout, httpcore.ConnectTimeout, "the TLS handshake"))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """``httpcore`` network backend: DNS, connect, reads and writes bounded by the current
    deadline; with ``block_private`` every resolved address is checked before connecting (see
    the module docstring). Thread-safe (no per-connection state here)."""

    def __init__(self, block_private: bool = False,
                 blocked: Callable[[str], bool] = is_blocked) -> None:
        self.block_private = block_private
        self._blocked = blocked  # the address rule (tests narrow it to one loopback address)
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        timeout = _budget(timeout, httpcore.ConnectTimeout, "connecting")
        addresses = _RESOLVER.resolve(host, port, timeout)
        if self.block_private:
            blocked = [a for a in addresses if self._blocked(a)]
            if blocked:
                raise BlockedAddress(f"{host} resolves to {blocked[0]}, a private, loopback, "
                                     "link-local or otherwise non-public address (block_private)")
        last: Exception | None = None
        for address in addresses:  # connect to the checked address itself: no second lookup
            try:
                stream = self._inner.connect_tcp(
                    address, port, _budget(timeout, httpcore.ConnectTimeout, "connecting"),
                    local_address=local_address, socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            return _DeadlineStream(stream)
        if last is not None:
            raise last
        raise httpcore.ConnectError(f"DNS lookup of {host} returned no address")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not supported for image downloads")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose ``httpcore`` pool uses a :class:`DeadlineBackend`."""

    def __init__(self, backend: DeadlineBackend, *, verify: ssl.SSLContext | str | bool = True,
                 limits: httpx.Limits | None = None, proxy: str | None = None) -> None:
        limits = limits or httpx.Limits()
        super().__init__(verify=verify, limits=limits)
        self.backend = backend
        ssl_context = httpx.create_ssl_context(verify=verify)
        common: dict[str, Any] = {
            "ssl_context": ssl_context, "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry, "network_backend": backend,
        }
        if proxy is None:
            self._pool = httpcore.ConnectionPool(**common)
        else:
            url = httpx.URL(proxy)
            if url.scheme not in ("http", "https"):
                raise ValueError(f"proxy must be an http:// or https:// URL, got {url.scheme!r}")
            self._pool = httpcore.HTTPProxy(
                proxy_url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                       target=url.raw_path), **common)


def http_client(*, block_private: bool = False, proxy: str | None = None,
                limits: httpx.Limits | None = None,
                verify: ssl.SSLContext | str | bool = True) -> httpx.Client:
    """A new ``httpx.Client`` for :func:`~otel_stages.imaging.download` with the total deadline
    and (``block_private``) the private-address guard built in. Redirects are not followed by the
    client: ``download`` follows them hop by hop. Close it when done (``with http_client() as c``).
    Raises ``ValueError`` for a proxy URL that is not http(s)."""
    if block_private and proxy is not None:
        raise ValueError("block_private cannot be enforced through a proxy: the proxy resolves "
                         "and connects, not this process")
    transport = _Transport(DeadlineBackend(block_private), verify=verify, limits=limits, proxy=proxy)
    return httpx.Client(transport=transport, follow_redirects=False)


def guards_private(client: httpx.Client) -> bool:
    """True when ``client`` was built by :func:`http_client` with ``block_private=True``."""
    transport = getattr(client, "_transport", None)
    return isinstance(transport, _Transport) and transport.backend.block_private


def bounds_total_time(client: httpx.Client) -> bool:
    """True when ``client`` enforces the total deadline (built by :func:`http_client`)."""
    return isinstance(getattr(client, "_transport", None), _Transport)


class _Shared:
    """The per-process clients behind :func:`shared_client`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[bool, httpx.Client] = {}
        self.pid = os.getpid()
        self.proxy_noted = False

    def reset_after_fork(self) -> None:
        # The parent's connections are not ours to use or close: drop the clients unclosed.
        self.lock = threading.Lock()
        self.clients = {}
        self.pid = os.getpid()


_SHARED = _Shared()


def shared_client(block_private: bool = False) -> httpx.Client:
    """The process-wide pooled client for ``block_private`` (built on first use, thread-safe,
    re-created after ``fork()``)."""
    client = _SHARED.clients.get(block_private)
    if client is not None and _SHARED.pid == os.getpid():
        return client
    with _SHARED.lock:
        if _SHARED.pid != os.getpid():  # fork without the at-fork hook (e.g. a raw os.fork copy)
            _SHARED.reset_after_fork()
        client = _SHARED.clients.get(block_private)
        if client is None:
            client = _SHARED.clients[block_private] = http_client(block_private=block_private)
            if not _SHARED.proxy_noted and any(os.environ.get(v) for v in _PROXY_ENV):
                _SHARED.proxy_noted = True
                logger.info("otel_stages.imaging.download's built-in client connects directly and "
                            "does not use HTTP(S)_PROXY; pass client=imaging.http_client(proxy=...) "
                            "to download through a proxy")
        return client


def close_shared() -> None:
    """Close the shared clients (tests; they are re-created on next use)."""
    with _SHARED.lock:
        clients, _SHARED.clients = list(_SHARED.clients.values()), {}
    for client in clients:
        client.close()


def _after_fork_in_child() -> None:
    _SHARED.reset_after_fork()
    _RESOLVER.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
