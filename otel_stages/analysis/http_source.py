"""HTTP plumbing shared by the remote report sources (Jaeger, Tempo, Prometheus).

:func:`get_json` is the one place that talks to a server; every failure becomes a
:class:`SourceError` whose message names the full URL and the server's own error text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from otel_stages.analysis.model import Recording

if TYPE_CHECKING:
    import httpx

#: Seconds to wait for connect / each read before giving up on a request.
DEFAULT_TIMEOUT_S = 30.0
#: Traces read in parallel (each is one small GET).
FETCH_WORKERS = 8
#: Characters of an error response body quoted in a :class:`SourceError`.
_BODY_SNIPPET = 300


class SourceError(Exception):
    """A remote source could not be read. The message names the URL and what went wrong
    (unreachable, timeout, HTTP status with the server's own error text, not JSON); ``status`` is
    the HTTP status when the server answered with an error, else ``None``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def http_client(timeout_s: float = DEFAULT_TIMEOUT_S) -> httpx.Client:
    """An ``httpx.Client`` with ``timeout_s`` and ``Accept: application/json`` (Tempo would
    otherwise be free to answer in protobuf). The caller closes it (use it as a context manager)."""
    import httpx  # only the remote sources need it

    return httpx.Client(
        timeout=httpx.Timeout(timeout_s),
        headers={"Accept": "application/json", "User-Agent": "otel-stages"},
        follow_redirects=True,
    )


def get_json(client: Any, url: str, params: Mapping[str, Any] | None = None) -> Any:
    """``GET url`` with ``params`` and return the decoded JSON body.

    Raises :class:`SourceError` naming the full URL (query string included) when the server cannot
    be reached, does not answer within the client's timeout, answers with a status other than
    200 (the message quotes the server's error text: Prometheus ``error``, Jaeger ``errors[].msg``,
    or the start of the body), or answers with something that is not JSON.
    """
    import httpx

    try:
        response = client.get(url, params=params)
    except httpx.TimeoutException as exc:
        raise SourceError(f"GET {_full_url(url, params)}: no answer in time ({exc})") from None
    except httpx.HTTPError as exc:
        raise SourceError(f"GET {_full_url(url, params)}: cannot connect ({exc})") from None
    where = str(response.request.url)
    if response.status_code != 200:
        raise SourceError(
            f"GET {where}: HTTP {response.status_code} {response.reason_phrase}"
            f"{_error_text(response.text)}",
            status=response.status_code,
        )
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(f"GET {where}: the answer is not JSON ({exc})") from None


def _full_url(url: str, params: Mapping[str, Any] | None) -> str:
    if not params:
        return url
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"{url}?{query}"


def _error_text(body: str) -> str:
    """The server's own error message, if the body says one."""
    text = body.strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, Mapping):
        if isinstance(doc.get("error"), str):  # Prometheus
            return f": {doc.get('errorType', 'error')}: {doc['error']}"
        errors = doc.get("errors")
        if isinstance(errors, list) and errors:  # Jaeger
            msgs = [str(e.get("msg", e)) if isinstance(e, Mapping) else str(e) for e in errors]
            return ": " + "; ".join(msgs)
    if not text:
        return ""
    return ": " + (text[:_BODY_SNIPPET] + ("..." if len(text) > _BODY_SNIPPET else ""))


def read_traces(client: Any, root: str, trace_ids: Sequence[str],
                parse: Callable[[Any, str], Recording], *, source: str, limit: int,
                params: Mapping[str, Any] | None = None,
                on_trace: Callable[[int, int], None] | None = None) -> Recording:
    """GET ``{root}/api/traces/{id}`` for every id, ``FETCH_WORKERS`` at a time, and merge what
    ``parse(doc, where)`` makes of each answer.

    One trace that cannot be read does not stop the others: a trace gone since the search (404),
    one the server refuses (Tempo answers 422 for a trace above its size limit, Jaeger 5xx when
    its storage fails on one trace) or an answer that is not JSON becomes a problem naming the
    trace and the server's message, and the rest is reported. Reaching ``limit`` ids adds a
    problem saying older traces were left out. ``source`` ("jaeger", "tempo") prefixes problems.
    Raises :class:`SourceError` only when *every* read failed (the server went away after the
    search): then the first failure is the error, with the count. ``on_trace(done, total)`` is
    called after each trace is read (or fails), for progress bars.
    """

    def read(trace_id: str) -> tuple[Recording, bool]:
        try:
            doc = get_json(client, f"{root}/api/traces/{quote(trace_id, safe='')}", params)
        except SourceError as exc:
            what = "not found any more" if exc.status == 404 else "could not be read"
            return Recording(problems=[f"{source}: trace {trace_id} {what} ({exc})"]), False
        return parse(doc, f"{source} {trace_id}"), True

    out = Recording()
    failed: list[str] = []
    with ThreadPoolExecutor(max_workers=FETCH_WORKERS) as pool:
        for done, (part, ok) in enumerate(pool.map(read, trace_ids), start=1):
            out.extend(part)
            if not ok:
                failed.append(part.problems[0])
            if on_trace is not None:
                on_trace(done, len(trace_ids))
    if trace_ids and len(failed) == len(trace_ids):
        more = f" (and the other {len(failed) - 1} traces failed too)" if len(failed) > 1 else ""
        raise SourceError(failed[0] + more)
    if len(trace_ids) >= limit:
        out.problems.append(
            f"{source}: the search returned the limit of {limit} traces; others in the window were"
            " left out (raise --limit or shorten --since)")
    return out
