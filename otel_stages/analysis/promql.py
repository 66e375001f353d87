"""PromQL for the fleet-wide report, and decoding of Prometheus query answers. Pure.

Series (collector ``span_metrics`` connector, unit ms, namespace ``traces.span.metrics``, written
through Prometheus' OTLP receiver with ``UnderscoreEscapingWithSuffixes``; see
``collector_config/otel-stages.yaml`` and ``deploy/prometheus/rules.yaml``)::

    traces_span_metrics_duration_milliseconds_{bucket,sum,count}{service_name, span_name, le}
    hw_gpu_utilization_ratio{job, hw_id, ...}      # hw.gpu.utilization, unit "1" (0..1)

:func:`build_queries` gives the PromQL text; :func:`parse_vector` / :func:`parse_gpu_matrix` decode
``/api/v1/query`` answers. :mod:`otel_stages.analysis.aggregate` turns them into a report and
:mod:`otel_stages.analysis.prometheus` fetches them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.model import MetricPoint

#: Histogram family written by the span-metrics connector (ms).
SPAN_DURATION = "traces_span_metrics_duration_milliseconds"
#: hw.gpu.utilization (unit "1") as Prometheus names it.
GPU_UTILIZATION = "hw_gpu_utilization_ratio"
#: Quantiles asked of histogram_quantile, by result key.
QUANTILES: dict[str, float] = {"p5": 0.05, "p50": 0.5, "p95": 0.95, "p99": 0.99}
#: Span names queried: the request span (for the request count and total) and the stages.
SPAN_NAMES: tuple[str, ...] = (semconv.SPAN_REQUEST, *semconv.STANDARD_STAGES)
_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def promql_string(text: str) -> str:
    """``text`` as a double-quoted PromQL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _re2(text: str) -> str:
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in text)


def span_selector(service: str | None) -> str:
    """Label matchers for the stage series (``service_name`` exact when given)."""
    names = promql_string("|".join(_re2(n) for n in SPAN_NAMES))
    service_part = f"service_name={promql_string(service)}, " if service else ""
    return "{" + service_part + f"span_name=~{names}" + "}"


def gpu_selector(service: str | None) -> str:
    """Matchers for GPU series: the OTLP receiver sets ``job`` to ``[namespace/]service.name``."""
    if not service:
        return ""
    return "{job=~" + promql_string(f"{_re2(service)}|.+/{_re2(service)}") + "}"


def build_queries(service: str | None, window_s: int) -> dict[str, str]:
    """Every instant query of the aggregate report, by name, for the last ``window_s`` seconds."""
    sel, w = span_selector(service), f"[{window_s}s]"
    queries = {
        "buckets": f"sum by (le, span_name) (increase({SPAN_DURATION}_bucket{sel}{w}))",
        "mean": (
            f"sum by (span_name) (rate({SPAN_DURATION}_sum{sel}{w}))"
            f" / sum by (span_name) (rate({SPAN_DURATION}_count{sel}{w}))"
        ),
    }
    for key, q in QUANTILES.items():
        queries[key] = (
            f"histogram_quantile({q},"
            f" sum by (le, span_name) (rate({SPAN_DURATION}_bucket{sel}{w})))"
        )
    gsel = gpu_selector(service)
    queries["gpu_mean"] = f"avg(avg_over_time({GPU_UTILIZATION}{gsel}{w}))"
    queries["gpu_samples"] = f"sum(count_over_time({GPU_UTILIZATION}{gsel}{w}))"
    return queries


# --- decoding /api/v1/query answers --------------------------------------------------------------


def _number(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def parse_vector(doc: Any) -> list[tuple[dict[str, str], float | None]]:
    """``{"status": "success", "data": {"resultType": "vector", "result": [{"metric", "value":
    [t, "v"]}]}}`` -> ``[(labels, value)]`` (NaN/Inf -> ``None``). Raises ``ValueError`` for
    anything else."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, Mapping) or doc.get("status") != "success":
        raise ValueError(f"not a successful Prometheus answer: {str(doc)[:200]}")
    if data.get("resultType") == "scalar":
        return [({}, _number(data["result"][1]))]
    if data.get("resultType") != "vector":
        raise ValueError(f"expected an instant vector, got {data.get('resultType')!r}")
    return [
        (dict(item.get("metric") or {}), _number((item.get("value") or [None, None])[1]))
        for item in data.get("result") or []
    ]


def _ns_from_seconds(raw: Any) -> int:
    """Prometheus sample time (float seconds, ms precision) -> integer ns, exactly."""
    try:
        return int(Decimal(str(raw)).scaleb(3).to_integral_value()) * 1_000_000
    except InvalidOperation:
        raise ValueError(f"bad sample time {raw!r}") from None


def parse_gpu_matrix(doc: Any) -> list[MetricPoint]:
    """A range-vector answer for ``hw_gpu_utilization_ratio`` -> ``hw.gpu.utilization`` points with
    the sample times (ms precision, as ns) and ``hw.id`` from the ``hw_id`` label. Pure."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
        raise ValueError("expected a range vector (matrix) answer")
    points = []
    for series in data.get("result") or []:
        labels = dict(series.get("metric") or {})
        attributes = {k.replace("_", ".", 1): v for k, v in labels.items() if k.startswith("hw_")}
        resource = {semconv.SERVICE_NAME: labels["job"]} if "job" in labels else {}
        for t, v in series.get("values") or []:
            value = _number(v)
            if value is not None:
                points.append(
                    MetricPoint(
                        semconv.HW_GPU_UTILIZATION, _ns_from_seconds(t), value, attributes, resource
                    )
                )
    return points
