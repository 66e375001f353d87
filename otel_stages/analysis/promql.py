"""PromQL for the fleet-wide report, and decoding of Prometheus query answers. Pure.

Series of the bundled pipeline (collector ``span_metrics`` connector, unit ms, namespace
``traces.span.metrics``, written through Prometheus' OTLP receiver with
``UnderscoreEscapingWithSuffixes``; see ``collector_config/otel-stages.yaml``)::

    traces_span_metrics_duration_milliseconds_{bucket,sum,count}{service_name, span_name, le}
    hw_gpu_utilization_ratio{job, hw_id, ...}      # hw.gpu.utilization, unit "1" (0..1)

Real deployments name the span-metrics histogram in other ways too; :data:`KNOWN_NAMINGS` lists
them (:class:`SpanMetricsNaming`: family, span and service label, unit), and
:func:`find_namings` / :func:`fit_labels` pick the one a Prometheus actually holds from its metric
names and label names (:mod:`otel_stages.analysis.prometheus` asks the API). Answers are then
brought to the canonical shape :mod:`otel_stages.analysis.aggregate` reads (label ``span_name``,
milliseconds) by :func:`normalize_answer`.

:func:`build_queries` gives the PromQL text; :func:`parse_vector` / :func:`parse_gpu_matrix` decode
``/api/v1/query`` answers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.model import MetricPoint

#: Histogram family written by the span-metrics connector (ms).
SPAN_DURATION = "traces_span_metrics_duration_milliseconds"
#: hw.gpu.utilization (unit "1") as Prometheus names it.
GPU_UTILIZATION = "hw_gpu_utilization_ratio"
#: Prometheus labels of the GPU metrics whose attribute name has more than one dot (the
#: Collector's translation turns every dot into ``_``): the others are ``hw_x`` -> ``hw.x``.
_LABEL_ATTRIBUTES = {"hw_gpu_task": semconv.HW_GPU_TASK}
#: Quantiles asked of histogram_quantile, by result key.
QUANTILES: dict[str, float] = {"p5": 0.05, "p50": 0.5, "p95": 0.95, "p99": 0.99}
#: Span names queried: the request span (for the request count and total) and the stages.
SPAN_NAMES: tuple[str, ...] = (semconv.SPAN_REQUEST, *semconv.STANDARD_STAGES)
_RE2_SPECIAL = set("\\.+*?()|[]{}^$")
_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

#: Label that holds the span name, in order of preference (connector / processor / untranslated).
SPAN_LABELS: tuple[str, ...] = ("span_name", "span.name", "operation")
#: Label that holds service.name.
SERVICE_LABELS: tuple[str, ...] = ("service_name", "service.name", "service")
#: hw.gpu.utilization as Prometheus may name it: OTLP with suffixes, untranslated, no suffixes.
GPU_UTILIZATION_NAMES: tuple[str, ...] = (
    "hw_gpu_utilization_ratio",
    "hw.gpu.utilization",
    "hw_gpu_utilization",
)
#: Units a span-metrics histogram may be in, as ms per unit.
UNIT_MS: dict[str, float] = {"ms": 1.0, "s": 1000.0}


@dataclass(frozen=True)
class SpanMetricsNaming:
    """How one Prometheus names the span-duration histogram.

    ``family`` is the name without ``_bucket``/``_sum``/``_count``; ``span_label`` /
    ``service_label`` hold the span name and ``service.name``; ``unit`` is ``"ms"`` or ``"s"``
    (``unit_known`` false when only assumed); ``producer`` says in words what writes it.
    """

    family: str
    span_label: str
    service_label: str
    unit: str
    producer: str
    unit_known: bool = True

    def series(self, suffix: str) -> str:
        """``family_<suffix>`` (``bucket``, ``sum``, ``count``)."""
        return f"{self.family}_{suffix}"

    @property
    def ms_per_unit(self) -> float:
        """Milliseconds per unit of the histogram's values and ``le`` bounds."""
        return UNIT_MS[self.unit]

    def describe(self) -> str:
        """One line for the report: which series and labels, and the unit."""
        unit = self.unit if self.unit_known else f"{self.unit} (assumed: the name does not say)"
        return (
            f"span metrics read from {self.series('bucket')} (labels {self.span_label},"
            f" {self.service_label}; unit {unit}): {self.producer}"
        )


def _naming(
    family: str, span: str, service: str, unit: str, producer: str, *, known: bool = True
) -> SpanMetricsNaming:
    return SpanMetricsNaming(family, span, service, unit, producer, unit_known=known)


_CONNECTOR = "the collector's span_metrics connector"
#: Every span-metrics naming met in practice, most current first.
KNOWN_NAMINGS: tuple[SpanMetricsNaming, ...] = (
    _naming("traces_span_metrics_duration_milliseconds", "span_name", "service_name", "ms",
            f"{_CONNECTOR} (namespace traces.span.metrics, the default since 0.109), OTLP or"
            " exporter names with unit suffixes"),
    _naming("traces_span_metrics_duration_seconds", "span_name", "service_name", "s",
            f"{_CONNECTOR} with histogram unit s"),
    _naming("traces_span_metrics_duration", "span_name", "service_name", "ms",
            f"{_CONNECTOR}, Prometheus OTLP translation without unit suffixes"
            " (UnderscoreEscapingWithoutSuffixes)", known=False),
    _naming("traces.span.metrics.duration", "span.name", "service.name", "ms",
            f"{_CONNECTOR}, Prometheus OTLP ingestion without translation (NoTranslation)",
            known=False),
    _naming("traces.span.metrics.duration_milliseconds", "span.name", "service.name", "ms",
            f"{_CONNECTOR}, Prometheus OTLP ingestion with UTF-8 names (NoUTF8EscapingWithSuffixes)"),
    _naming("traces.span.metrics.duration_seconds", "span.name", "service.name", "s",
            f"{_CONNECTOR} with unit s, Prometheus OTLP ingestion with UTF-8 names"),
    _naming("duration_milliseconds", "span_name", "service_name", "ms",
            f"{_CONNECTOR} before 0.109 (no namespace)"),
    _naming("duration_seconds", "span_name", "service_name", "s",
            f"{_CONNECTOR} before 0.109 (no namespace) with unit s"),
    _naming("traces_spanmetrics_latency", "span_name", "service", "s",
            "Grafana Tempo's metrics-generator (span-metrics processor)"),
    _naming("traces_spanmetrics_duration_milliseconds", "span_name", "service_name", "ms",
            f"{_CONNECTOR} with namespace traces.spanmetrics (Grafana Alloy's default)"),
    _naming("traces_spanmetrics_duration_seconds", "span_name", "service_name", "s",
            f"{_CONNECTOR} with namespace traces.spanmetrics and unit s"),
    _naming("latency", "operation", "service_name", "ms",
            "the deprecated spanmetrics processor (before the connector)"),
)
#: The bundled pipeline's naming (collector_config/otel-stages.yaml + deploy/prometheus).
DEFAULT_NAMING = KNOWN_NAMINGS[0]


def _family_of(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def unit_from_name(family: str) -> str | None:
    """``"ms"``/``"s"`` when the family name says so (``_milliseconds``/``_seconds``), else
    ``None``."""
    if family.endswith("milliseconds"):
        return "ms"
    if family.endswith("seconds"):
        return "s"
    return None


def find_namings(metric_names: Iterable[str]) -> list[SpanMetricsNaming]:
    """The :data:`KNOWN_NAMINGS` whose ``_bucket`` series is among ``metric_names`` (the answer of
    ``/api/v1/label/__name__/values``), in preference order. Also a histogram named
    ``<prefix>_latency`` (the old processor behind an exporter ``namespace``). Pure."""
    names = set(metric_names)
    found = [n for n in KNOWN_NAMINGS if n.series("bucket") in names]
    known = {n.family for n in KNOWN_NAMINGS}
    for name in sorted(names):
        family = _family_of(name)
        if name.endswith("_latency_bucket") and family not in known:
            found.append(replace(KNOWN_NAMINGS[-1], family=family))
    return found


def naming_for(
    metric: str,
    *,
    span_label: str | None = None,
    service_label: str | None = None,
    unit: str | None = None,
) -> SpanMetricsNaming:
    """The naming for a family given by the user (``--metric``; a ``_bucket``/``_sum``/``_count``
    series name is accepted too). Known families keep their labels and unit; otherwise labels
    default to ``span_name``/``service_name`` and the unit comes from the name, else ``unit``,
    else ms (marked as assumed). Explicit arguments win."""
    family = _family_of(metric.strip())
    known = next((n for n in KNOWN_NAMINGS if n.family == family), None)
    base = known or SpanMetricsNaming(
        family, SPAN_LABELS[0], SERVICE_LABELS[0], unit_from_name(family) or "ms",
        "given with --metric", unit_known=unit_from_name(family) is not None,
    )
    return replace(
        base,
        span_label=span_label or base.span_label,
        service_label=service_label or base.service_label,
        unit=unit or base.unit,
        unit_known=base.unit_known or unit is not None,
    )


def fit_labels(
    naming: SpanMetricsNaming,
    label_names: Sequence[str],
    *,
    span_label: str | None = None,
    service_label: str | None = None,
) -> SpanMetricsNaming:
    """Adjust ``naming`` to the label names its series really carry (the answer of
    ``/api/v1/labels?match[]=...``): the first of :data:`SPAN_LABELS` / :data:`SERVICE_LABELS`
    present, when the expected one is not. Explicit labels win. Pure."""
    present = set(label_names)

    def pick(expected: str, options: tuple[str, ...], given: str | None) -> str:
        if given:
            return given
        if expected in present or not present:
            return expected
        return next((o for o in options if o in present), expected)

    return replace(
        naming,
        span_label=pick(naming.span_label, SPAN_LABELS, span_label),
        service_label=pick(naming.service_label, SERVICE_LABELS, service_label),
    )


def with_unit(naming: SpanMetricsNaming, unit: str | None) -> SpanMetricsNaming:
    """``naming`` with the unit Prometheus' metadata gave (``"ms"``, ``"s"``, ``"milliseconds"``,
    ``"seconds"``), when the name did not already say it."""
    if naming.unit_known or not unit:
        return naming
    canonical = {"ms": "ms", "milliseconds": "ms", "s": "s", "seconds": "s"}.get(unit.strip().lower())
    return naming if canonical is None else replace(naming, unit=canonical, unit_known=True)


def metric_selector(metric: str, matchers: Sequence[str] = ()) -> str:
    """``metric{m1, m2}``, or ``{"metric", m1, m2}`` for a name that needs Prometheus 3's
    quoted UTF-8 syntax (dots)."""
    if _LEGACY_NAME.fullmatch(metric):
        return metric + ("{" + ", ".join(matchers) + "}" if matchers else "")
    return "{" + ", ".join([promql_string(metric), *matchers]) + "}"


def label_name(name: str) -> str:
    """A label name as PromQL needs it: bare, or quoted (``"span.name"``, Prometheus 3)."""
    return name if _LEGACY_LABEL.fullmatch(name) else promql_string(name)


def promql_string(text: str) -> str:
    """``text`` as a double-quoted PromQL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _re2(text: str) -> str:
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in text)


def span_matchers(service: str | None, naming: SpanMetricsNaming = DEFAULT_NAMING) -> list[str]:
    """Label matchers for the stage series (service label exact when given)."""
    names = promql_string("|".join(_re2(n) for n in SPAN_NAMES))
    service_part = [f"{label_name(naming.service_label)}={promql_string(service)}"] if service else []
    return [*service_part, f"{label_name(naming.span_label)}=~{names}"]


def span_selector(service: str | None, naming: SpanMetricsNaming = DEFAULT_NAMING) -> str:
    """``{service_name="S", span_name=~"request|download|..."}`` in ``naming``'s labels."""
    return "{" + ", ".join(span_matchers(service, naming)) + "}"


def gpu_selector(service: str | None) -> str:
    """Matchers for GPU series: the OTLP receiver sets ``job`` to ``[namespace/]service.name``."""
    if not service:
        return ""
    return "{job=~" + promql_string(f"{_re2(service)}|.+/{_re2(service)}") + "}"


def gpu_matchers(service: str | None, metric: str = GPU_UTILIZATION) -> list[str]:
    """:func:`gpu_selector` as a matcher list, and the compute engine's series only: no
    ``hw.gpu.task`` or ``general`` (:func:`otel_stages.analysis.gpu_owners.is_model_utilization`;
    the label as ``metric`` is named: ``hw_gpu_task`` translated, ``hw.gpu.task`` not)."""
    sel = gpu_selector(service)
    task = semconv.HW_GPU_TASK if "." in metric else semconv.HW_GPU_TASK.replace(".", "_")
    engine = f"{label_name(task)}=~{promql_string('|' + semconv.HW_GPU_TASK_GENERAL)}"
    return [*([sel[1:-1]] if sel else []), engine]


def build_queries(
    service: str | None,
    window_s: int,
    naming: SpanMetricsNaming = DEFAULT_NAMING,
    gpu_metric: str = GPU_UTILIZATION,
) -> dict[str, str]:
    """Every instant query of the aggregate report, by name, for the last ``window_s`` seconds,
    in ``naming``'s series and labels (results keep those labels: see :func:`normalize_answer`)."""
    matchers, w = span_matchers(service, naming), f"[{window_s}s]"
    span = label_name(naming.span_label)

    def sel(suffix: str) -> str:
        return metric_selector(naming.series(suffix), matchers) + w

    queries = {
        "buckets": f"sum by (le, {span}) (increase({sel('bucket')}))",
        "mean": f"sum by ({span}) (rate({sel('sum')})) / sum by ({span}) (rate({sel('count')}))",
    }
    for key, q in QUANTILES.items():
        queries[key] = f"histogram_quantile({q}, sum by (le, {span}) (rate({sel('bucket')})))"
    gpu = metric_selector(gpu_metric, gpu_matchers(service, gpu_metric)) + w
    queries["gpu_mean"] = f"avg(avg_over_time({gpu}))"
    queries["gpu_samples"] = f"sum(count_over_time({gpu}))"
    return queries


#: Query names whose values are durations in the histogram's unit.
DURATION_KEYS: frozenset[str] = frozenset({"mean", *QUANTILES})


def normalize_answer(key: str, doc: Any, naming: SpanMetricsNaming) -> Any:
    """An ``/api/v1/query`` answer of query ``key`` in the canonical shape of the bundled
    pipeline: the span label renamed ``span_name``, ``le`` bounds and durations in ms. Other
    answers, and answers already canonical, come back unchanged. Pure (returns a copy)."""
    scale = naming.ms_per_unit
    rename = naming.span_label != "span_name"
    if not isinstance(doc, Mapping) or not isinstance(doc.get("data"), Mapping):
        return doc
    if (key not in DURATION_KEYS and key != "buckets") or (scale == 1.0 and not rename):
        return doc
    result = doc["data"].get("result")
    if not isinstance(result, list):
        return doc
    items = []
    for item in result:
        if not isinstance(item, Mapping):
            items.append(item)
            continue
        metric = dict(item.get("metric") or {})
        if rename and naming.span_label in metric:
            metric["span_name"] = metric.pop(naming.span_label)
        value = item.get("value")
        if key == "buckets" and scale != 1.0 and "le" in metric:
            metric["le"] = _scaled(metric["le"], scale)
        elif key in DURATION_KEYS and scale != 1.0 and isinstance(value, list) and len(value) == 2:
            value = [value[0], _scaled(value[1], scale)]
        items.append({**item, "metric": metric, "value": value})
    return {**doc, "data": {**doc["data"], "result": items}}


def _scaled(raw: Any, scale: float) -> Any:
    try:
        number = float(raw)
    except (TypeError, ValueError):
        return raw
    if math.isinf(number) or math.isnan(number):
        return raw
    return repr(number * scale).removesuffix(".0")


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
    """A range-vector answer for ``hw_gpu_utilization_ratio`` (or its untranslated name) ->
    ``hw.gpu.utilization`` points with the sample times (ms precision, as ns) and ``hw.id`` from the
    ``hw_id`` (or ``hw.id``) label. Pure."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
        raise ValueError("expected a range vector (matrix) answer")
    points = []
    for series in data.get("result") or []:
        labels = dict(series.get("metric") or {})
        attributes = {
            _LABEL_ATTRIBUTES.get(k, k.replace("_", ".", 1)): v
            for k, v in labels.items() if k.startswith(("hw_", "hw."))
        }
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
