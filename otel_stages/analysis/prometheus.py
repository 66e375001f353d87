"""Fetch the fleet-wide report (and raw GPU samples) from Prometheus' HTTP API.

A few PromQL queries (:mod:`otel_stages.analysis.promql`) against ``GET /api/v1/query`` instead
of downloading traces; :mod:`otel_stages.analysis.aggregate` builds the report from the answers.
:func:`fetch_gpu_samples` reads raw GPU samples for a trace window, for
``report --jaeger/--tempo ... --prometheus``.
"""

from __future__ import annotations

from otel_stages.analysis.aggregate import AggregateReport, aggregate_report
from otel_stages.analysis.http_source import DEFAULT_TIMEOUT_S, SourceError, get_json, http_client
from otel_stages.analysis.model import MetricPoint
from otel_stages.analysis.promql import GPU_UTILIZATION, build_queries, gpu_selector, parse_gpu_matrix


def eval_time(now_ns: int) -> str:
    """``time=`` parameter: seconds since the epoch with millisecond digits."""
    return f"{now_ns // 1_000_000_000}.{now_ns // 1_000_000 % 1000:03d}"


def fetch_prometheus_report(
    base_url: str,
    *,
    service: str | None,
    since_ns: int,
    now_ns: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> AggregateReport:
    """Run :func:`build_queries` for the ``since_ns`` before ``now_ns`` (ns; the window is rounded
    up to whole seconds) against ``GET /api/v1/query`` and build the report.

    Raises :class:`SourceError` naming the URL and query when a query fails or answers oddly.
    """
    window_s = max(1, -(-since_ns // 1_000_000_000))
    url = f"{base_url.rstrip('/')}/api/v1/query"
    answers = {}
    with http_client(timeout_s) as client:
        for name, query in build_queries(service, window_s).items():
            answers[name] = get_json(client, url, {"query": query, "time": eval_time(now_ns)})
    try:
        return aggregate_report(answers, window_s=window_s, service=service)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise SourceError(f"GET {url}: unexpected answer ({exc})") from None


def gpu_samples_query(service: str | None, range_s: int) -> str:
    """Raw GPU utilization samples of the last ``range_s`` seconds (a range vector)."""
    return f"{GPU_UTILIZATION}{gpu_selector(service)}[{range_s}s]"


def fetch_gpu_samples(
    base_url: str,
    *,
    service: str | None,
    start_ns: int,
    end_ns: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[MetricPoint]:
    """Raw ``hw.gpu.utilization`` samples between ``start_ns`` and ``end_ns`` (the traces' span
    window) with their own timestamps, so the trace report can line them up with forward spans.
    Raises :class:`SourceError` when the query fails."""
    range_s = max(1, -(-(end_ns - start_ns) // 1_000_000_000) + 1)
    url = f"{base_url.rstrip('/')}/api/v1/query"
    params = {"query": gpu_samples_query(service, range_s), "time": eval_time(end_ns + 999_999)}
    with http_client(timeout_s) as client:
        doc = get_json(client, url, params)
    try:
        return parse_gpu_matrix(doc)
    except (ValueError, TypeError, AttributeError) as exc:
        raise SourceError(f"GET {url}: unexpected answer ({exc})") from None
