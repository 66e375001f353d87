"""Fetch the fleet-wide report (and raw GPU samples) from Prometheus' HTTP API.

A few PromQL queries (:mod:`otel_stages.analysis.promql`) against ``GET /api/v1/query`` instead
of downloading traces; :mod:`otel_stages.analysis.aggregate` builds the report from the answers.
:func:`fetch_gpu_samples` reads raw GPU samples for a trace window, for
``report --jaeger/--tempo ... --prometheus``.

Naming is found, not assumed (:func:`discover_naming`): ``GET /api/v1/label/__name__/values``
(metric names with series in the window) picks the span-metrics family among
:data:`~otel_stages.analysis.promql.KNOWN_NAMINGS`, ``GET /api/v1/labels?match[]=<family>_bucket``
the span and service labels, and ``GET /api/v1/metadata?metric=<family>`` the unit when the name
does not carry it. The report's evidence says which was chosen; ``--metric``, ``--span-label``,
``--service-label`` and ``--metric-unit`` override. Answers are normalised to the canonical shape
(label ``span_name``, milliseconds) before :mod:`~otel_stages.analysis.aggregate` sees them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.aggregate import AggregateReport, aggregate_report, format_window
from otel_stages.analysis.http_source import DEFAULT_TIMEOUT_S, SourceError, get_json, http_client
from otel_stages.analysis.model import MetricPoint
from otel_stages.analysis.promql import (
    DEFAULT_NAMING,
    GPU_UTILIZATION,
    GPU_UTILIZATION_NAMES,
    KNOWN_NAMINGS,
    QUANTILES,
    SpanMetricsNaming,
    build_queries,
    find_namings,
    fit_labels,
    gpu_matchers,
    metric_selector,
    naming_for,
    normalize_answer,
    parse_gpu_matrix,
    span_matchers,
    with_unit,
)

#: What Prometheus answers for a query without series (used for span queries not sent).
EMPTY_VECTOR: dict[str, Any] = {"status": "success", "data": {"resultType": "vector", "result": []}}


def eval_time(now_ns: int) -> str:
    """``time=`` parameter: seconds since the epoch with millisecond digits."""
    return f"{now_ns // 1_000_000_000}.{now_ns // 1_000_000 % 1000:03d}"


@dataclass(frozen=True)
class NamingOverrides:
    """What the user pinned: ``metric`` (``--metric``), ``span_label``, ``service_label``,
    ``unit`` (``"ms"``/``"s"``). ``None`` means find it."""

    metric: str | None = None
    span_label: str | None = None
    service_label: str | None = None
    unit: str | None = None


@dataclass
class Discovery:
    """The outcome of :func:`discover_naming`: the ``naming`` used, the GPU metric name, the other
    span-metrics families present (``others``), and notes for the report."""

    naming: SpanMetricsNaming
    gpu_metric: str
    found: bool
    others: list[SpanMetricsNaming] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _strings(doc: Any, url: str) -> list[str]:
    """``{"status": "success", "data": [str, ...]}`` -> the strings."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, list) or doc.get("status") != "success":
        raise SourceError(f"GET {url}: unexpected answer ({str(doc)[:200]})")
    return [str(x) for x in data]


def _metadata_unit(doc: Any, family: str) -> str | None:
    """The ``unit`` of ``family`` in an ``/api/v1/metadata`` answer, if Prometheus has one."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    entries = data.get(family) if isinstance(data, Mapping) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and entry.get("unit"):
            return str(entry["unit"])
    return None


def discover_naming(
    client: Any, root: str, *, start_s: int, end_s: int, overrides: NamingOverrides = NamingOverrides()
) -> Discovery:
    """Find the span-metrics family, labels and unit, and the GPU utilization name, that this
    Prometheus holds between ``start_s`` and ``end_s`` (see the module docstring). Raises
    :class:`SourceError` when an API call fails."""
    window = {"start": str(start_s), "end": str(end_s)}
    names_url = f"{root}/api/v1/label/__name__/values"
    names = _strings(get_json(client, names_url, window), names_url)
    gpu_metric = next((n for n in GPU_UTILIZATION_NAMES if n in names), GPU_UTILIZATION)
    if overrides.metric:
        naming = naming_for(
            overrides.metric,
            span_label=overrides.span_label,
            service_label=overrides.service_label,
            unit=overrides.unit,
        )
        found = naming.series("bucket") in names
        others = [n for n in find_namings(names) if n.family != naming.family]
    else:
        candidates = find_namings(names)
        found = bool(candidates)
        naming, others = (candidates[0], candidates[1:]) if candidates else (DEFAULT_NAMING, [])
    notes: list[str] = []
    if found:
        labels_url = f"{root}/api/v1/labels"
        labels = _strings(
            get_json(client, labels_url, {"match[]": metric_selector(naming.series("bucket")), **window}),
            labels_url,
        )
        naming = fit_labels(
            naming, labels, span_label=overrides.span_label, service_label=overrides.service_label
        )
        if overrides.unit:
            naming = with_unit(naming, overrides.unit)
        elif not naming.unit_known:
            meta = get_json(client, f"{root}/api/v1/metadata", {"metric": naming.family})
            naming = with_unit(naming, _metadata_unit(meta, naming.family))
    if others:
        notes.append(
            "also present: " + ", ".join(o.series("bucket") for o in others)
            + " (pick one with --metric)"
        )
    return Discovery(naming=naming, gpu_metric=gpu_metric, found=found, others=others, notes=notes)


def _not_found(
    discovery: Discovery, service: str | None, window_s: int, given: str | None
) -> list[str]:
    """Evidence for an empty answer: the series and labels queried, and what to try."""
    n = discovery.naming
    window = format_window(window_s)
    if not discovery.found and given:
        return [
            f"--metric {given}: Prometheus has no {n.series('bucket')} series in the last {window}",
            "check the name in Prometheus (metric names are case-sensitive; give the histogram,"
            " with or without _bucket)",
        ]
    if not discovery.found:
        looked = ", ".join(k.series("bucket") for k in KNOWN_NAMINGS)
        return [
            f"no span-metrics histogram has series in the last {window}: looked for {looked}"
            " (and any *_latency_bucket) among the metric names Prometheus holds",
            "name yours with --metric NAME (and --span-label / --service-label / --metric-unit if"
            " they differ)",
        ]
    return [
        f"queried {metric_selector(n.series('bucket'), span_matchers(service, n))} over the last"
        f" {window}: no series for the stage spans"
        + ("" if not service else f" of {n.service_label}={service!r}"),
        f"check the span names ({semconv.SPAN_REQUEST}, {', '.join(semconv.STANDARD_STAGES)}) and the"
        f" service name; other label names can be given with --span-label / --service-label",
    ]


#: At most this many service names are listed when the asked-for service has no series.
MAX_SERVICES_LISTED = 20


def label_path(label: str) -> str:
    """``label`` as the path segment of ``/api/v1/label/<name>/values``: as is when a legacy
    name (``[a-zA-Z_][a-zA-Z0-9_]*``), else Prometheus 3's ``U__`` escaping (``service.name`` ->
    ``U__service_2e_name``; source: prometheus/common ``model/metric.go`` ``EscapeName``,
    ``ValueEncodingEscaping``)."""
    if re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label):
        return label
    out = ["U__"]
    for ch in label:
        if ch == "_":
            out.append("__")
        elif ch.isascii() and (ch.isalnum()):
            out.append(ch)
        else:
            out.append(f"_{ord(ch):x}_")
    return "".join(out)


def _services_present(root: str, naming: SpanMetricsNaming, start_s: int, end_s: int,
                      timeout_s: float) -> list[str]:
    """One evidence line naming the services that have ``naming``'s series in the window (the
    ``--service`` asked for has none); nothing when Prometheus cannot say."""
    url = f"{root}/api/v1/label/{label_path(naming.service_label)}/values"
    params = {"match[]": metric_selector(naming.series("bucket")), "start": str(start_s),
              "end": str(end_s)}
    try:
        with http_client(timeout_s) as client:
            values = _strings(get_json(client, url, params), url)
    except SourceError:
        return []
    if not values:
        return []
    shown = ", ".join(repr(v) for v in values[:MAX_SERVICES_LISTED])
    more = f" and {len(values) - MAX_SERVICES_LISTED} more" if len(values) > MAX_SERVICES_LISTED else ""
    return [f"services with {naming.series('bucket')} series in that window ({naming.service_label}):"
            f" {shown}{more}"]


def fetch_prometheus_report(
    base_url: str,
    *,
    service: str | None,
    since_ns: int,
    now_ns: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    overrides: NamingOverrides = NamingOverrides(),
) -> AggregateReport:
    """Find the naming (:func:`discover_naming`), run :func:`build_queries` for the ``since_ns``
    before ``now_ns`` (ns; the window is rounded up to whole seconds) against
    ``GET /api/v1/query``, normalise the answers and build the report. Its evidence names the
    series and labels used; when nothing matched, the series and labels queried.

    Raises :class:`SourceError` naming the URL and query when a query fails or answers oddly.
    """
    window_s = max(1, -(-since_ns // 1_000_000_000))
    root = base_url.rstrip("/")
    url = f"{root}/api/v1/query"
    end_s = -(-now_ns // 1_000_000_000)
    answers: dict[str, Any] = {}
    with http_client(timeout_s) as client:
        discovery = discover_naming(
            client, root, start_s=end_s - window_s, end_s=end_s, overrides=overrides
        )
        queries = build_queries(service, window_s, discovery.naming, discovery.gpu_metric)
        if not discovery.found:  # nothing to ask about spans: only the GPU queries go out
            queries = {k: q for k, q in queries.items() if k.startswith("gpu_")}
        for name in ("buckets", "mean", *QUANTILES):
            answers[name] = EMPTY_VECTOR
        for name, query in queries.items():
            doc = get_json(client, url, {"query": query, "time": eval_time(now_ns)})
            answers[name] = normalize_answer(name, doc, discovery.naming)
    try:
        report = aggregate_report(answers, window_s=window_s, service=service)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise SourceError(f"GET {url}: unexpected answer ({exc})") from None
    report.queries = queries
    if report.stages:
        report.verdict.evidence.append(discovery.naming.describe())
    else:
        report.verdict.evidence.extend(_not_found(discovery, service, window_s, overrides.metric))
        if discovery.found and service:
            report.verdict.evidence.extend(_services_present(root, discovery.naming, end_s - window_s,
                                                             end_s, timeout_s))
    report.verdict.evidence.extend(discovery.notes)
    return report


def gpu_samples_query(service: str | None, range_s: int, metric: str = GPU_UTILIZATION) -> str:
    """Raw GPU utilization samples of the last ``range_s`` seconds (a range vector)."""
    return f"{metric_selector(metric, gpu_matchers(service, metric))}[{range_s}s]"


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
