"""Regenerate the recorded Jaeger / Tempo / Prometheus response bodies in this folder.

    python tests/data/sources/make_recordings.py

Each recording is what the real API answers for the traces of one scenario file in
``tests/data/traces`` (the same traces, so the report must reach the same verdict from each). The
conversions follow what the servers do; nothing here imports otel_stages, so the recordings do not
inherit the readers' bugs.

``jaeger_<scenario>.json``: ``{"search": <GET /api/traces body>, "traces": {id: <GET
/api/traces/<id> body>}}``. Jaeger's OTLP->model translator plus its UI JSON (as in Jaeger's own
fixture ``cmd/jaeger/internal/extension/jaegerquery/internal/fixture/otlp2jaeger-out.json``):
times truncated to microseconds (``startTime = start_ns // 1000``, ``duration = (end_ns - start_ns)
// 1000``), the parent as a ``CHILD_OF`` reference, the resource as a ``processes`` entry
(``serviceName`` + tags), attributes as typed tags (``string``/``bool``/``int64``/``float64``) after
``otel.scope.name`` and before ``span.kind``; an ERROR status adds ``otel.status_code`` and
``error: true``; ``logs: []``, ``warnings: null``; envelope ``total/limit/offset: 0``,
``errors: null``.

``tempo_<scenario>.json``: ``{"search": <GET /api/search body>, "traces": {id: <GET
/api/traces/<id> body>}}``. Search ``traceID`` is hex without leading zeros, 3 spans per span set
(Tempo's default ``spss``). Traces are ``batches`` written by a protobuf JSON marshaler: base64
ids, enum names (``SPAN_KIND_INTERNAL``), int64 as strings, empty fields omitted. With
``LEGACY = {...}`` scenarios use Tempo 1.x names ``instrumentationLibrarySpans`` /
``instrumentationLibrary``.

``prometheus_<scenario>.json``: ``/api/v1/query`` bodies by query kind, as Prometheus would
answer them over a window holding every span of the scenario: the span-metrics connector's
explicit buckets (collector_config/otel-stages.yaml), ``histogram_quantile`` computed with
Prometheus' own bucket interpolation, the window mean of ``hw_gpu_utilization_ratio``, and the raw
GPU samples (ms timestamps) as a range-vector answer.
"""

from __future__ import annotations

import base64
import json
import math
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACES = HERE.parent / "traces"
SCENARIOS = {
    "jaeger": ["gpu_busy", "queue_batching", "cold_start"],
    "tempo": ["gpu_busy", "queue_batching", "cold_start"],
    "prometheus": ["gpu_busy", "queue_batching"],
}
LEGACY = {"queue_batching"}  # Tempo 1.x field names for this one
#: span_metrics connector buckets (ms), collector_config/otel-stages.yaml
BUCKETS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000]
SPAN_NAMES = ["request", "download", "decode", "resize", "queue", "forward"]
KIND_NAMES = {
    0: "unspecified",
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
}
KIND_ENUMS = {
    0: "SPAN_KIND_UNSPECIFIED",
    1: "SPAN_KIND_INTERNAL",
    2: "SPAN_KIND_SERVER",
    3: "SPAN_KIND_CLIENT",
    4: "SPAN_KIND_PRODUCER",
    5: "SPAN_KIND_CONSUMER",
}


def load(scenario: str) -> tuple[list[dict], list[dict]]:
    """(spans with their resource and scope, gauge points) of a scenario file, raw OTLP/JSON."""
    spans, points = [], []
    for line in (TRACES / f"{scenario}.otlp.jsonl").read_text().splitlines():
        doc = json.loads(line)
        for rs in doc.get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    spans.append(
                        {"span": span, "resource": rs["resource"], "scope": ss.get("scope", {})}
                    )
        for rm in doc.get("resourceMetrics", []):
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    for p in (metric.get("gauge") or {}).get("dataPoints", []):
                        points.append(
                            {"name": metric["name"], "point": p, "resource": rm["resource"]}
                        )
    return spans, points


def any_value(v: dict):
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    return int(v["intValue"])


def attrs(items) -> dict:
    return {a["key"]: any_value(a["value"]) for a in items or []}


def by_trace(spans: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for s in spans:
        out[s["span"]["traceId"]].append(s)
    return out


# --- Jaeger ------------------------------------------------------------------------------------


def jaeger_tag(key: str, value) -> dict:
    kind = {bool: "bool", int: "int64", float: "float64"}.get(type(value), "string")
    return {"key": key, "type": kind, "value": value}


def jaeger_trace(trace_id: str, items: list[dict]) -> dict:
    processes: dict[str, dict] = {}
    keys: dict[str, str] = {}
    spans = []
    for item in items:
        span, resource = item["span"], attrs(item["resource"]["attributes"])
        rkey = json.dumps(resource, sort_keys=True)
        if rkey not in keys:
            keys[rkey] = f"p{len(keys) + 1}"
            service = resource.pop("service.name", "unknown_service")
            processes[keys[rkey]] = {
                "serviceName": service,
                "tags": [jaeger_tag(k, v) for k, v in resource.items()],
            }
        start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
        tags = []
        if item["scope"].get("name"):
            tags.append(jaeger_tag("otel.scope.name", item["scope"]["name"]))
        tags += [jaeger_tag(k, v) for k, v in attrs(span.get("attributes")).items()]
        tags.append(jaeger_tag("span.kind", KIND_NAMES[span.get("kind", 0)]))
        if span.get("status", {}).get("code") in (2, "STATUS_CODE_ERROR"):
            tags += [jaeger_tag("otel.status_code", "ERROR"), jaeger_tag("error", True)]
        parent = span.get("parentSpanId")
        spans.append(
            {
                "traceID": trace_id,
                "spanID": span["spanId"],
                "operationName": span["name"],
                "references": [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": parent}]
                if parent
                else [],
                "startTime": start // 1000,
                "duration": (end - start) // 1000,
                "tags": tags,
                "logs": [],
                "processID": keys[rkey],
                "warnings": None,
            }
        )
    return {"traceID": trace_id, "spans": spans, "processes": processes, "warnings": None}


def envelope(data: list) -> dict:
    return {"data": data, "total": 0, "limit": 0, "offset": 0, "errors": None}


def jaeger_recording(scenario: str) -> dict:
    traces = {tid: jaeger_trace(tid, items) for tid, items in by_trace(load(scenario)[0]).items()}
    newest_first = sorted(traces.values(), key=lambda t: -min(s["startTime"] for s in t["spans"]))
    return {
        "search": envelope(newest_first),
        "traces": {tid: envelope([t]) for tid, t in traces.items()},
    }


# --- Tempo -------------------------------------------------------------------------------------


def b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def tempo_span(span: dict) -> dict:
    out = {"traceId": b64(span["traceId"]), "spanId": b64(span["spanId"])}
    if span.get("parentSpanId"):
        out["parentSpanId"] = b64(span["parentSpanId"])
    out.update(name=span["name"], kind=KIND_ENUMS[span.get("kind", 0)])
    out.update(
        startTimeUnixNano=str(span["startTimeUnixNano"]),
        endTimeUnixNano=str(span["endTimeUnixNano"]),
    )
    if span.get("attributes"):
        out["attributes"] = span["attributes"]  # OTLP/JSON AnyValue already (int64 as strings)
    code = span.get("status", {}).get("code")
    out["status"] = {"code": "STATUS_CODE_ERROR"} if code in (2, "STATUS_CODE_ERROR") else {}
    return out


def tempo_trace(items: list[dict], legacy: bool) -> dict:
    groups: dict[str, dict] = {}
    for item in items:
        key = json.dumps([item["resource"], item["scope"]], sort_keys=True)
        groups.setdefault(key, {"resource": item["resource"], "scope": item["scope"], "spans": []})
        groups[key]["spans"].append(tempo_span(item["span"]))
    batches = []
    for g in groups.values():
        scope_key, list_key = (
            ("instrumentationLibrary", "instrumentationLibrarySpans")
            if legacy
            else ("scope", "scopeSpans")
        )
        batches.append(
            {"resource": g["resource"], list_key: [{scope_key: g["scope"], "spans": g["spans"]}]}
        )
    return {"batches": batches}


def tempo_search_hit(trace_id: str, items: list[dict]) -> dict:
    spans = [i["span"] for i in items]
    root = next((s for s in spans if not s.get("parentSpanId")), spans[0])
    start = min(int(s["startTimeUnixNano"]) for s in spans)
    end = max(int(s["endTimeUnixNano"]) for s in spans)
    service = attrs(items[0]["resource"]["attributes"]).get("service.name")
    shown = [
        {
            "spanID": s["spanId"],
            "startTimeUnixNano": s["startTimeUnixNano"],
            "durationNanos": str(int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])),
            "attributes": [{"key": "service.name", "value": {"stringValue": service}}],
        }
        for s in spans[:3]
    ]
    span_set = {"spans": shown, "matched": len(spans)}
    return {
        "traceID": trace_id.lstrip("0"),
        "rootServiceName": service,
        "rootTraceName": root["name"],
        "startTimeUnixNano": str(start),
        "durationMs": (end - start) // 1_000_000,
        "spanSet": span_set,
        "spanSets": [span_set],
    }


def tempo_recording(scenario: str) -> dict:
    traces = by_trace(load(scenario)[0])
    hits = sorted(
        (tempo_search_hit(tid, items) for tid, items in traces.items()),
        key=lambda h: -int(h["startTimeUnixNano"]),
    )
    size = sum(len(json.dumps(i["span"])) for items in traces.values() for i in items)
    return {
        "search": {
            "traces": hits,
            "metrics": {
                "inspectedTraces": len(hits),
                "inspectedBytes": str(size),
                "completedJobs": 1,
                "totalJobs": 1,
            },
        },
        "traces": {
            tid.lstrip("0"): tempo_trace(items, scenario in LEGACY) for tid, items in traces.items()
        },
    }


# --- Prometheus --------------------------------------------------------------------------------


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' bucketQuantile (promql/quantile.go) on cumulative (upper bound, count) pairs."""
    if not buckets or not math.isinf(buckets[-1][0]) or len(buckets) < 2:
        return math.nan
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def fmt(value: float) -> str:
    """Prometheus sample values: shortest float text, NaN / +Inf spelled its way."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return (
        repr(float(value)).removesuffix(".0") if float(value).is_integer() else repr(float(value))
    )


def vector(at: float, rows: list[tuple[dict, float]]) -> dict:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [at, fmt(v)]} for m, v in rows],
        },
    }


def prometheus_recording(scenario: str) -> dict:
    spans, points = load(scenario)
    durations: dict[str, list[float]] = defaultdict(list)
    for item in spans:
        s = item["span"]
        if s["name"] in SPAN_NAMES:
            durations[s["name"]].append(
                (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e6
            )
    last_ns = max(int(i["span"]["endTimeUnixNano"]) for i in spans)
    at = round((last_ns // 1_000_000 + 60_000) / 1000, 3)  # evaluated a minute after the last span
    cumulative: dict[str, list[tuple[float, float]]] = {}
    for name, values in durations.items():
        cumulative[name] = [(le, float(sum(v <= le for v in values))) for le in BUCKETS_MS]
        cumulative[name].append((math.inf, float(len(values))))
    out = {
        "buckets": vector(
            at,
            [
                ({"le": "+Inf" if math.isinf(le) else fmt(le), "span_name": n}, c)
                for n, b in cumulative.items()
                for le, c in b
            ],
        ),
        "mean": vector(at, [({"span_name": n}, sum(v) / len(v)) for n, v in durations.items()]),
    }
    for key, q in {"p5": 0.05, "p50": 0.5, "p95": 0.95, "p99": 0.99}.items():
        out[key] = vector(
            at, [({"span_name": n}, bucket_quantile(q, b)) for n, b in cumulative.items()]
        )
    gpu = [p for p in points if p["name"] == "hw.gpu.utilization"]
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    labels: dict[str, dict] = {}
    for p in gpu:
        a = attrs(p["point"]["attributes"])
        r = attrs(p["resource"]["attributes"])
        key = a["hw.id"]
        labels[key] = {
            "__name__": "hw_gpu_utilization_ratio",
            **{k.replace(".", "_"): v for k, v in a.items()},
            "job": r["service.name"],
            "instance": r.get("service.instance.id", ""),
        }
        series[key].append(
            (int(p["point"]["timeUnixNano"]) // 1_000_000, float(p["point"]["asDouble"]))
        )
    means = [sum(v for _, v in s) / len(s) for s in series.values()]
    out["gpu_mean"] = vector(at, [({}, sum(means) / len(means))] if means else [])
    out["gpu_samples"] = vector(
        at, [({}, float(sum(len(s) for s in series.values())))] if means else []
    )
    out["gpu_raw"] = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {k: v for k, v in labels[key].items() if v != ""},
                    "values": [[ms / 1000, fmt(v)] for ms, v in sorted(s)],
                }
                for key, s in series.items()
            ],
        },
    }
    return out


def main() -> None:
    makers = {
        "jaeger": jaeger_recording,
        "tempo": tempo_recording,
        "prometheus": prometheus_recording,
    }
    for source, scenarios in SCENARIOS.items():
        for scenario in scenarios:
            path = HERE / f"{source}_{scenario}.json"
            path.write_text(json.dumps(makers[source](scenario), separators=(",", ":")) + "\n")
            print(f"wrote {path.relative_to(HERE.parents[2])} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
