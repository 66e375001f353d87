"""``otel-stages report`` from Jaeger, Tempo and Prometheus, against recorded response bodies of
the real formats served by a local HTTP server (tests/data/sources, made by make_recordings.py
from the scenario files in tests/data/traces, so every source holds the same traces).

``promtool`` parses every PromQL expression the report sends; a missing promtool skips that test,
except under ``CI`` (then it fails), as in test_deploy.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from otel_stages.analysis import Recording, diagnose, load_paths
from otel_stages.analysis.aggregate import StageSummary, decide_aggregate, gpu_from_window, summarize
from otel_stages.analysis.jaeger import parse_jaeger_response, parse_jaeger_span
from otel_stages.analysis.prometheus import gpu_samples_query
from otel_stages.analysis.promql import build_queries
from otel_stages.analysis.tempo import parse_tempo_trace
from otel_stages.cli import main
from otel_stages.commands.remote import parse_since

DATA = Path(__file__).parent / "data"
SOURCES = DATA / "sources"
TRACES = DATA / "traces"
ANSWERS = json.loads((TRACES / "answers.json").read_text())
CONTRACT = {"requests", "stages", "cold_start", "verdict"}
HOUR_NS = 3600 * 10**9

Handler = Callable[[str, dict[str, list[str]]], tuple[int, object]]


@dataclass
class Recorded:
    """A local HTTP server answering from recorded bodies; ``seen`` lists (path, params)."""

    url: str = ""
    routes: list[tuple[str, Handler]] = field(default_factory=list)
    seen: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)

    def route(self, prefix: str, handler: Handler) -> None:
        self.routes.append((prefix, handler))

    def paths(self, prefix: str) -> list[tuple[str, dict[str, list[str]]]]:
        return [(p, q) for p, q in self.seen if p.startswith(prefix)]


class _Server(ThreadingHTTPServer):
    request_queue_size = 64  # the readers open several connections at once (default backlog: 5)


def _start(rec: Recorded) -> ThreadingHTTPServer:
    class Handle(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True  # headers and body go out as separate writes

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            params = parse_qs(parts.query)
            rec.seen.append((parts.path, params))
            # longest matching prefix wins ("/api/traces/<id>" over "/api/traces")
            matches = [
                (p, h) for p, h in rec.routes if parts.path == p or parts.path.startswith(p + "/")
            ]
            status, body = (404, {"error": "no route"})
            if matches:
                prefix, handler = max(matches, key=lambda m: len(m[0]))
                status, body = handler(parts.path[len(prefix) :].lstrip("/"), params)
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = _Server(("127.0.0.1", 0), Handle)
    threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    rec.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    return httpd


@pytest.fixture
def make_server() -> Iterator[Callable[[], Recorded]]:
    """Start local servers on demand (one per backend); all stop at teardown."""
    started: list[ThreadingHTTPServer] = []

    def make() -> Recorded:
        rec = Recorded()
        started.append(_start(rec))
        return rec

    yield make
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server(make_server) -> Recorded:
    return make_server()


def _recording(name: str) -> dict:
    return json.loads((SOURCES / f"{name}.json").read_text())


def serve_jaeger(rec: Recorded, scenario: str, *, search: dict | None = None) -> dict:
    cassette = _recording(f"jaeger_{scenario}")
    rec.route(
        "/api/traces",
        lambda rest, q: (
            (200, search or cassette["search"])
            if not rest
            else (
                (200, cassette["traces"][rest])
                if rest in cassette["traces"]
                else (404, {"data": None, "errors": [{"code": 404, "msg": "trace not found"}]})
            )
        ),
    )
    return cassette


def serve_tempo(rec: Recorded, scenario: str) -> dict:
    cassette = _recording(f"tempo_{scenario}")
    rec.route("/api/search", lambda rest, q: (200, cassette["search"]))
    rec.route(
        "/api/traces",
        lambda rest, q: (
            (200, cassette["traces"][rest])
            if rest in cassette["traces"]
            else (404, "trace not found")
        ),
    )
    return cassette


#: query kind -> recorded answer key (the family and labels vary with the naming served)
def _prom_patterns(family: str, gpu: str) -> list[tuple[re.Pattern[str], str]]:
    def name(series: str) -> str:  # bare, or quoted UTF-8 as the first matcher
        return re.escape(series) + r"[{\[]" if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", series) else (
            r"\{" + re.escape(json.dumps(series))
        )

    return [
        (re.compile(r"^histogram_quantile\(0\.05,"), "p5"),
        (re.compile(r"^histogram_quantile\(0\.5,"), "p50"),
        (re.compile(r"^histogram_quantile\(0\.95,"), "p95"),
        (re.compile(r"^histogram_quantile\(0\.99,"), "p99"),
        (re.compile(r"increase\(" + name(family + "_bucket")), "buckets"),
        (re.compile(r"rate\(" + name(family + "_sum") + r".*\brate\(" + name(family + "_count")), "mean"),
        (re.compile(r"^avg\(avg_over_time\(" + name(gpu)), "gpu_mean"),
        (re.compile(r"^sum\(count_over_time\(" + name(gpu)), "gpu_samples"),
        (re.compile(r"^hw_gpu_utilization_ratio(\{[^}]*\})?\[\d+s\]$"), "gpu_raw"),
    ]


PROM_PATTERNS = _prom_patterns("traces_span_metrics_duration_milliseconds", "hw_gpu_utilization_ratio")


@dataclass(frozen=True)
class Naming:
    """How a Prometheus names the span-metrics histogram (a row of the issue's list)."""

    family: str
    span_label: str = "span_name"
    service_label: str = "service_name"
    ms_per_unit: float = 1.0
    gpu: str = "hw_gpu_utilization_ratio"
    metadata_unit: str = ""


BUNDLED = Naming("traces_span_metrics_duration_milliseconds")


def _rename(doc: dict, key: str, naming: Naming) -> dict:
    """A recorded (bundled-naming) answer as this naming's Prometheus writes it: span label
    renamed, le bounds and durations in the naming's unit; value strings formatted the way
    Prometheus formats floats (Go strconv 'f', -1: shortest repr, no trailing .0)."""
    doc = json.loads(json.dumps(doc))
    for item in doc["data"]["result"]:
        metric = item["metric"]
        if "span_name" in metric and naming.span_label != "span_name":
            metric[naming.span_label] = metric.pop("span_name")
        if naming.ms_per_unit != 1.0:
            if key == "buckets" and metric.get("le") not in (None, "+Inf"):
                metric["le"] = _go_float(float(metric["le"]) / naming.ms_per_unit)
            elif key in ("mean", "p5", "p50", "p95", "p99"):
                item["value"][1] = _go_float(float(item["value"][1]) / naming.ms_per_unit)
    return doc


def _go_float(x: float) -> str:
    text = repr(x)
    return text[:-2] if text.endswith(".0") else text


def serve_prometheus(rec: Recorded, scenario: str, naming: Naming = BUNDLED, *, other_names=()) -> dict:
    """/api/v1/query from the recording (in ``naming``'s names), plus the discovery endpoints:
    /api/v1/label/__name__/values, /api/v1/labels?match[]=..., /api/v1/metadata."""
    answers = _recording(f"prometheus_{scenario}")
    patterns = _prom_patterns(naming.family, naming.gpu)
    names = sorted(
        {f"{naming.family}_{s}" for s in ("bucket", "sum", "count")}
        | {naming.gpu, "up", "scrape_duration_seconds", *other_names}
    )
    labels = sorted({"__name__", "le", naming.span_label, naming.service_label, "job", "span_kind",
                     "status_code", "collector_instance_id"})

    def answer(rest: str, q: dict[str, list[str]]) -> tuple[int, object]:
        query = q["query"][0]
        for pattern, key in patterns:
            if pattern.search(query):
                return 200, _rename(answers[key], key, naming)
        return 400, {
            "status": "error",
            "errorType": "bad_data",
            "error": f"unrecorded query {query}",
        }

    def label_values(rest: str, q: dict[str, list[str]]) -> tuple[int, object]:
        if rest != "__name__/values":
            return 404, {"status": "error", "errorType": "not_found", "error": "unrecorded"}
        return 200, {"status": "success", "data": names}

    def label_names(rest: str, q: dict[str, list[str]]) -> tuple[int, object]:
        (match,) = q["match[]"]
        series = match.strip('{}"')
        return 200, {"status": "success", "data": labels if series == f"{naming.family}_bucket" else []}

    def metadata(rest: str, q: dict[str, list[str]]) -> tuple[int, object]:
        (metric,) = q["metric"]
        if metric != naming.family:
            return 200, {"status": "success", "data": {}}
        entry = {"type": "histogram", "help": "", "unit": naming.metadata_unit}
        return 200, {"status": "success", "data": {metric: [entry]}}

    rec.route("/api/v1/query", answer)
    rec.route("/api/v1/label", label_values)
    rec.route("/api/v1/labels", label_names)
    rec.route("/api/v1/metadata", metadata)
    return answers


def report_json(argv: list[str], capsys) -> tuple[int, dict, str]:
    code = main(["report", *argv, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else {}), out.err


def _verdict(d: dict) -> tuple[str | None, str | None]:
    return d["verdict"]["cause"], d["verdict"]["stage"]


# --- the same verdict from every source ---------------------------------------------------------


@pytest.mark.parametrize("scenario", ["gpu_busy", "queue_batching", "cold_start"])
def test_jaeger_tempo_and_file_give_the_same_verdict(scenario, make_server, capsys):
    jaeger, tempo, prometheus = make_server(), make_server(), make_server()
    serve_jaeger(jaeger, scenario)
    serve_tempo(tempo, scenario)
    serve_prometheus(prometheus, "gpu_busy")  # GPU samples: only gpu_busy's verdict needs them
    gpu = ["--prometheus", prometheus.url] if scenario == "gpu_busy" else []

    code, from_file, _ = report_json([str(TRACES / f"{scenario}.otlp.jsonl")], capsys)
    assert code == 0
    code, from_jaeger, err = report_json(
        ["--jaeger", jaeger.url, "--service", "vlm-server", *gpu], capsys
    )
    assert code == 0, err
    code, from_tempo, err = report_json(
        ["--tempo", tempo.url, "--service", "vlm-server", *gpu], capsys
    )
    assert code == 0, err
    if gpu:  # raw samples over the traces' own span window, evaluated at its end
        (_, q), (_, q2) = prometheus.paths("/api/v1/query")
        assert q == q2 and re.fullmatch(
            r'hw_gpu_utilization_ratio\{job=~"[^"]+", hw_gpu_task=~"\|general"\}\[(\d+)s\]',
            q["query"][0]
        )
        spans = load_paths([TRACES / f"{scenario}.otlp.jsonl"]).spans
        first, last = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
        range_s = int(re.search(r"\[(\d+)s\]", q["query"][0]).group(1))
        assert float(q["time"][0]) * 1e9 >= last and float(q["time"][0]) - range_s <= first / 1e9
        assert from_jaeger["gpu"]["level"] == from_file["gpu"]["level"] == "high"

    expected = ANSWERS[scenario]
    assert from_file["verdict"]["cause"] == expected["cause"]
    assert _verdict(from_jaeger) == _verdict(from_tempo) == _verdict(from_file)
    assert from_jaeger["source"] == "jaeger" and from_tempo["source"] == "tempo"
    assert from_jaeger["requests"] == from_tempo["requests"] == from_file["requests"] >= 25
    assert (from_file["cold_start"] is None) == (from_jaeger["cold_start"] is None)
    assert from_jaeger["problems"] == from_tempo["problems"] == []
    for name, stage in from_file["stages"].items():
        # Tempo keeps nanoseconds; Jaeger truncates start and duration to whole microseconds
        assert from_tempo["stages"][name] == stage
        assert from_jaeger["stages"][name]["median_ms"] == pytest.approx(
            stage["median_ms"], abs=0.002
        )


def test_gpu_verdict_needs_the_gpu_samples(server, capsys):
    """Without --prometheus the traces alone cannot tell a busy GPU: cause 'forward'."""
    serve_jaeger(server, "gpu_busy")
    code, out, _ = report_json(["--jaeger", server.url, "--service", "vlm-server"], capsys)
    assert code == 0 and _verdict(out) == ("forward", "forward")
    assert out["gpu"]["level"] == "none"


def test_jaeger_spans_equal_the_file_spans_truncated_to_microseconds():
    cassette = _recording("jaeger_cold_start")
    jaeger = Recording()
    for body in cassette["traces"].values():
        jaeger.extend(parse_jaeger_response(body))
    file_spans = {
        (s.trace_id, s.span_id): s for s in load_paths([TRACES / "cold_start.otlp.jsonl"]).spans
    }
    assert jaeger.problems == [] and len(jaeger.spans) == len(file_spans) == 150
    for span in jaeger.spans:
        f = file_spans[(span.trace_id, span.span_id)]
        assert (span.parent_span_id, span.name, span.attributes, span.resource, span.error) == (
            f.parent_span_id,
            f.name,
            f.attributes,
            f.resource,
            f.error,
        )
        assert span.start_ns == f.start_ns // 1000 * 1000
        assert span.end_ns == (f.start_ns // 1000 + (f.end_ns - f.start_ns) // 1000) * 1000
    assert any(isinstance(s.attributes.get("request.seq"), int) for s in jaeger.spans)


@pytest.mark.parametrize("scenario", ["gpu_busy", "queue_batching"])  # scopeSpans / legacy names
def test_tempo_spans_equal_the_file_spans(scenario):
    cassette = _recording(f"tempo_{scenario}")
    legacy = "instrumentationLibrarySpans" in json.dumps(next(iter(cassette["traces"].values())))
    assert legacy == (scenario == "queue_batching")
    tempo = Recording()
    for body in cassette["traces"].values():
        tempo.extend(parse_tempo_trace(body))
    assert tempo.problems == []
    key = lambda s: (s.trace_id, s.span_id)  # noqa: E731
    assert sorted(tempo.spans, key=key) == sorted(
        load_paths([TRACES / f"{scenario}.otlp.jsonl"]).spans, key=key
    )


# --- what the readers ask for ----------------------------------------------------------------------


def test_jaeger_query_parameters_and_raw_times(server, capsys):
    """Search by service over the window (µs), then every trace re-read with raw=true; the
    adjusted search body is not used for times (here: every span squashed to 0 µs)."""
    cassette = _recording("jaeger_queue_batching")
    adjusted = json.loads(json.dumps(cassette["search"]))
    for trace in adjusted["data"]:
        for span in trace["spans"]:
            span["duration"] = 0
            span["warnings"] = ["clock skew adjustment applied"]
    serve_jaeger(server, "queue_batching", search=adjusted)

    before_us = time.time_ns() // 1000
    code, out, err = report_json(
        [
            "--jaeger",
            server.url + "/",
            "--service",
            "vlm-server",
            "--since",
            "30m",
            "--limit",
            "40",
        ],
        capsys,
    )
    after_us = time.time_ns() // 1000
    assert code == 0, err
    assert _verdict(out) == ("queue", "queue") and out["problems"] == []

    (path, search), *reads = server.paths("/api/traces")
    assert path == "/api/traces"
    assert search["service"] == ["vlm-server"] and search["limit"] == ["40"]
    start, end = int(search["start"][0]), int(search["end"][0])
    assert before_us <= end <= after_us and end - start == 30 * 60 * 10**6
    ids = [p.rsplit("/", 1)[1] for p, _ in reads]
    assert sorted(ids) == sorted(cassette["traces"]) and len(ids) == 30
    assert all(q.get("raw") == ["true"] for _, q in reads)


def test_tempo_query_parameters(server, capsys):
    cassette = serve_tempo(server, "queue_batching")
    before_s = time.time()
    query = '{ resource.service.name = "vlm-server" && name = "queue" }'
    code, out, err = report_json(["--tempo", server.url, "--query", query, "--since", "2h"], capsys)
    assert code == 0, err
    assert _verdict(out) == ("queue", "queue") and out["requests"] == 30
    (_, search), *reads = server.paths("/api/search") + server.paths("/api/traces")
    assert search["q"] == [query] and search["limit"] == ["100"]
    start, end = int(search["start"][0]), int(search["end"][0])
    assert before_s - 1 <= end <= time.time() + 1 and 7200 <= end - start <= 7201
    # ids are read as the search gave them (Tempo trims leading zeros; this recording has two)
    assert sorted(p.rsplit("/", 1)[1] for p, _ in reads) == sorted(cassette["traces"])
    assert sum(len(i) < 32 for i in cassette["traces"]) == 2


def test_tempo_default_query_from_service(server, capsys):
    serve_tempo(server, "cold_start")
    code, _, err = report_json(["--tempo", server.url, "--service", 'vlm "x"'], capsys)
    # (the fake answers any query with vlm-server's traces: --service keeps that service's
    # requests among the traces returned, here none, and says which services it saw)
    assert code == 1 and "no span of service 'vlm \"x\"'; services seen: vlm-server" in err
    ((_, search),) = server.paths("/api/search")
    assert search["q"] == ['{resource.service.name="vlm \\"x\\""}']


def test_reaching_the_limit_is_reported(server, capsys):
    serve_jaeger(server, "cold_start")
    code, out, err = report_json(
        ["--jaeger", server.url, "--service", "vlm-server", "--limit", "25"], capsys
    )
    assert code == 0
    assert any("limit of 25 traces" in p for p in out["problems"]) and "limit of 25" in err


def test_a_trace_gone_since_the_search_is_a_problem_not_an_error(server, capsys):
    cassette = serve_jaeger(server, "queue_batching")
    gone = min(cassette["traces"])
    del cassette["traces"][gone]
    code, out, _ = report_json(["--jaeger", server.url, "--service", "vlm-server"], capsys)
    assert code == 0 and out["requests"] == 29
    assert any(gone in p and "not found" in p for p in out["problems"])


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, route, body, expect",
    [
        (
            "--jaeger",
            "/api/traces",
            {"data": None, "errors": [{"code": 500, "msg": "storage down"}]},
            "storage down",
        ),
        ("--tempo", "/api/search", "invalid TraceQL: parse error at line 1", "invalid TraceQL"),
        (
            "--prometheus",
            "/api/v1/label/__name__/values",
            {"status": "error", "errorType": "bad_data", "error": "parse error"},
            "bad_data: parse error",
        ),
    ],
)
def test_http_error_names_the_url_and_exits_1(source, route, body, expect, server, capsys):
    status = 400 if source == "--prometheus" else 500
    server.route(route, lambda rest, q: (status, body))
    argv = [source, server.url] + (["--service", "vlm-server"] if source != "--tempo" else [])
    code = main(["report", *argv, "--json"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{server.url}{route}?" in err and f"HTTP {status}" in err and expect in err


def test_unreachable_source_exits_1(capsys):
    with socket_closed_port() as port:
        code = main(["report", "--tempo", f"http://127.0.0.1:{port}", "--json"])
    err = capsys.readouterr().err
    assert code == 1 and f"127.0.0.1:{port}/api/search" in err and "cannot connect" in err


class socket_closed_port:  # noqa: N801 - used like a function
    """A port nothing listens on (bound then closed)."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize(
    "argv, message",
    [
        (["some.jsonl", "--jaeger", "http://x"], "not both"),
        (["--jaeger", "http://x"], "--jaeger needs --service"),
        (["--jaeger", "http://x", "--tempo", "http://y", "--service", "s"], "one trace source"),
        (["--query", "{}"], "--query is a TraceQL query for --tempo"),
        (["--prometheus", "http://x", "--limit", "5"], "--limit goes with"),
        (["--since", "1h"], "--since goes with"),
        (["--prometheus", "http://x", "--baseline", "a.jsonl"], "--baseline compares traces"),
        (["--metric", "m"], "--metric goes with --prometheus"),
        (["--jaeger", "http://x", "--service", "s", "--prometheus", "http://y", "--span-label", "n"],
         "--span-label goes with --prometheus (the fleet-wide report)"),
        (["--prometheus", "http://x", "--stage-map", "triton"], "--stage-map maps spans"),
        ([str(TRACES / "stable.otlp.jsonl"), "--stage-map", "nonexistent.yaml"],
         "--stage-map: nonexistent.yaml: no such stage map"),
        (["a.jsonl"], "no such file or folder: a.jsonl"),
    ],
)
def test_usage_errors(argv, message, capsys):
    assert main(["report", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, ns",
    [
        ("30m", 1800 * 10**9),
        ("1h", HOUR_NS),
        ("2d", 48 * HOUR_NS),
        ("1h30m", 5400 * 10**9),
        ("250ms", 250 * 10**6),
        ("1w", 168 * HOUR_NS),
        (" 45S ", 45 * 10**9),
    ],
)
def test_parse_since(text, ns):
    assert parse_since(text) == ns


@pytest.mark.parametrize("text", ["", "1", "h", "1x", "1.5h", "-1h", "0m", "1h 30m"])
def test_parse_since_rejects(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        parse_since(text)


# --- Prometheus ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["gpu_busy", "queue_batching"])
def test_prometheus_report_matches_the_trace_verdict(scenario, server, capsys):
    answers = serve_prometheus(server, scenario)
    code, out, err = report_json(["--prometheus", server.url, "--service", "vlm-server"], capsys)
    assert code == 0, err
    assert out["source"] == "prometheus" and set(out) >= CONTRACT and out["cold_start"] is None
    expected = ANSWERS[scenario]
    assert (
        out["verdict"]["cause"] == expected["cause"]
        and out["verdict"]["stage"] in expected["stage"]
    )
    assert out["requests"] == 30  # the request span's count over the window
    assert list(out["stages"]) == ["download", "decode", "resize", "queue", "forward"]

    recorded = {
        key: {
            r["metric"]["span_name"]: float(r["value"][1]) for r in answers[key]["data"]["result"]
        }
        for key in ("mean", "p50", "p95", "p99")
    }
    request_mean = recorded["mean"]["request"]  # shares are parts of all request time
    for name, stage in out["stages"].items():
        assert stage["min_ms"] is None and stage["max_ms"] is None
        assert stage["median_ms"] == pytest.approx(recorded["p50"][name], abs=1e-3)
        assert stage["p95_ms"] == pytest.approx(recorded["p95"][name], abs=1e-3)
        assert stage["p99_ms"] == pytest.approx(recorded["p99"][name], abs=1e-3)
        assert stage["share"] == pytest.approx(recorded["mean"][name] / request_mean, abs=1e-4)
        assert stage["rate_per_s"] == pytest.approx(30 / 3600, abs=1e-4)
    shares = sum(s["share"] for s in out["stages"].values()) + out["unaccounted"]["share"]
    assert shares == pytest.approx(1, abs=1e-3)
    file_verdict = diagnose(load_paths([TRACES / f"{scenario}.otlp.jsonl"])).verdict
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == (
        file_verdict.cause,
        file_verdict.stage,
    )


def test_prometheus_queries_sent(server, capsys):
    serve_prometheus(server, "queue_batching")
    before = time.time()
    code, out, _ = report_json(
        ["--prometheus", server.url, "--service", "vlm-server", "--since", "90m"], capsys
    )
    assert code == 0
    seen = server.paths("/api/v1/query")
    sent = [q["query"][0] for _, q in seen]
    assert (
        sorted(sent)
        == sorted(build_queries("vlm-server", 5400).values())
        == sorted(out["queries"].values())
    )
    assert all(before - 1 <= float(q["time"][0]) <= time.time() + 1 for _, q in seen)
    span_queries = [q for q in sent if "traces_span_metrics" in q]
    assert len(span_queries) == 6 and all(
        'service_name="vlm-server"' in q and "[5400s]" in q for q in span_queries
    )
    assert all('job=~"vlm-server|.+/vlm-server"' in q for q in sent if "hw_gpu" in q)


def test_prometheus_text_output(server, capsys):
    serve_prometheus(server, "queue_batching")
    assert main(["report", "--prometheus", server.url]) == 0
    text = capsys.readouterr().out
    assert "verdict: queue (queue)" in text and "all services" in text


def test_prometheus_without_data_exits_1(server, capsys):
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    server.route("/api/v1/query", lambda rest, q: (200, empty))
    server.route("/api/v1/label", lambda rest, q: (200, {"status": "success", "data": ["up"]}))
    code, out, err = report_json(["--prometheus", server.url, "--service", "nobody"], capsys)
    assert code == 1 and out["verdict"]["cause"] is None and "no span metrics" in err
    # the empty answer names what was looked for
    evidence = " ".join(out["verdict"]["evidence"])
    assert "traces_span_metrics_duration_milliseconds_bucket" in evidence
    assert "traces_spanmetrics_latency_bucket" in evidence and "latency_bucket" in evidence
    assert "--metric NAME" in evidence


def test_prometheus_family_present_but_no_stage_series_names_the_query(server, capsys):
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    serve_prometheus(server, "queue_batching")
    server.routes = [(p, h) for p, h in server.routes if p != "/api/v1/query"]
    server.route("/api/v1/query", lambda rest, q: (200, empty))
    code, out, _ = report_json(["--prometheus", server.url, "--service", "nobody"], capsys)
    assert code == 1
    assert (
        'queried traces_span_metrics_duration_milliseconds_bucket{service_name="nobody",'
        ' span_name=~"request|download|decode|resize|queue|forward"}' in out["verdict"]["evidence"][-2]
    )


def test_prometheus_unknown_service_lists_the_services_present(server, capsys):
    """--service names one with no series: the evidence lists the services that do have the
    family's series in the window (label values API), so a typo is one glance away."""
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    serve_prometheus(server, "queue_batching")
    server.routes = [(p, h) for p, h in server.routes if p != "/api/v1/query"]
    server.route("/api/v1/query", lambda rest, q: (200, empty))
    asked: list[tuple[str, dict]] = []

    def service_values(rest: str, q: dict[str, list[str]]) -> tuple[int, object]:
        asked.append((rest, q))
        return 200, {"status": "success", "data": ["vlm-server", "vlm-server-canary"]}

    server.routes.insert(0, ("/api/v1/label/service_name", service_values))
    code, out, _ = report_json(["--prometheus", server.url, "--service", "vlm-sever"], capsys)
    assert code == 1
    (rest, q), = asked
    assert rest == "values" and q["match[]"] == ["traces_span_metrics_duration_milliseconds_bucket"]
    assert ("services with traces_span_metrics_duration_milliseconds_bucket series in that window"
            " (service_name): 'vlm-server', 'vlm-server-canary'") in out["verdict"]["evidence"]


@pytest.mark.parametrize("label, path", [
    ("service_name", "service_name"), ("service.name", "U__service_2e_name"),
    ("span_name", "span_name"), ("a-b_c", "U__a_2d_b__c"),
])
def test_label_values_path_escapes_utf8_label_names(label, path):
    from otel_stages.analysis.prometheus import label_path

    assert label_path(label) == path


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        msg = "promtool (Debian package 'prometheus') is not installed (run .ci/install-tools.sh)"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{msg}; CI is set, so this check must run", pytrace=False)
        pytest.skip(msg)
    return path


def _promtool_check(exprs: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    rules = {
        "groups": [
            {
                "name": "otel-stages-report",
                "rules": [{"record": f"report:query_{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "report.rules.json"  # JSON is YAML: no PyYAML needed
    path.write_text(json.dumps(rules))
    return subprocess.run(
        [_promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("service", ["vlm-server", None, 'we"ird\\svc.(1)|x'])
def test_every_promql_expression_parses_with_promtool(service, tmp_path):
    exprs = [*build_queries(service, 3600).values(), gpu_samples_query(service, 120)]
    result = _promtool_check(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


@pytest.mark.parametrize("service", [None, "vlm-server"])
def test_the_gpu_queries_read_the_compute_engine_only(service, tmp_path):
    # hw.gpu.utilization split by hw.gpu.task (OpenTelemetry hardware GPU conventions): the general
    # engine at 1, the video engines at 0, a series without the label (otel-stages' own sampler)
    # at 0.5. Evaluated by promtool: averaged over all four the GPU read 0.375
    queries = build_queries(service, 60)
    raw = gpu_samples_query(service, 60)
    series = [('{hw_gpu_task="general"}', "1"), ('{hw_gpu_task="decoder"}', "0"),
              ('{hw_gpu_task="encoder"}', "0"), ("{}", "0.5")]
    job = 'job="vlm-server", hw_id="GPU-0"'
    suite = {
        "rule_files": ["report.rules.json"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "15s",
            "input_series": [{"series": "hw_gpu_utilization_ratio{" + (labels[1:-1] + ", " if labels != "{}" else "")
                              + job + "}", "values": f"{value}x10"} for labels, value in series],
            "promql_expr_test": [
                {"expr": queries["gpu_mean"], "eval_time": "2m",
                 "exp_samples": [{"labels": "{}", "value": 0.75}]},
                {"expr": f"count(count_over_time({raw}))", "eval_time": "2m",
                 "exp_samples": [{"labels": "{}", "value": 2}]},
            ],
        }],
    }
    (tmp_path / "report.rules.json").write_text(json.dumps({"groups": []}))
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    result = subprocess.run([_promtool(), "test", "rules", "suite.json"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_catches_a_broken_expression(tmp_path):
    exprs = list(build_queries("vlm-server", 3600).values())
    exprs[2] = exprs[2].replace("(", "", 1)
    result = _promtool_check(exprs, tmp_path)
    assert result.returncode != 0 and "report:query_2" in result.stdout + result.stderr


# --- aggregate verdict rules ---------------------------------------------------------------------


def _vec(rows):
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [1.0, str(v)]} for m, v in rows],
        },
    }


def _answers(stages: dict[str, list[tuple[float, float]]], q: dict[str, dict[str, float]]) -> dict:
    """Answers for summarize(): cumulative buckets per stage and per-quantile values."""
    return {
        "buckets": _vec(
            [({"le": str(le), "span_name": n}, c) for n, b in stages.items() for le, c in b]
        ),
        **{
            k: _vec([({"span_name": n}, v) for n, v in q[k].items()])
            for k in ("mean", "p5", "p50", "p95", "p99")
        },
    }


def test_a_spread_inside_one_bucket_is_not_a_swing():
    """All forwards in (100, 200] ms: interpolation says p5 105 / p95 195, but nothing proves a
    spread. Queue p5 lies in (0, 1] and p95 in (50, 100]: proven at least 49 ms apart."""
    flat = [(1, 0), (2, 0), (5, 0), (10, 0), (20, 0), (50, 0), (100, 0), (200, 100), ("+Inf", 100)]
    spread = [
        (1, 10),
        (2, 10),
        (5, 10),
        (10, 10),
        (20, 10),
        (50, 50),
        (100, 100),
        (200, 100),
        ("+Inf", 100),
    ]
    q = {
        "mean": {"forward": 150, "queue": 50},
        "p5": {"forward": 105, "queue": 0.5},
        "p50": {"forward": 150, "queue": 50},
        "p95": {"forward": 195, "queue": 95},
        "p99": {"forward": 199, "queue": 99},
    }
    stages, total = summarize(_answers({"forward": flat, "queue": spread}, q), window_s=60)
    assert stages["forward"].swing_floor_ms == 0 and stages["forward"].swing_ms == 90
    assert stages["queue"].swing_floor_ms == 49  # lower edge of p95's bucket - upper edge of p5's
    assert total is None and stages["forward"].share == pytest.approx(150 / 200)
    verdict = decide_aggregate(stages, total, gpu_from_window(None, None), 60)
    assert (verdict.cause, verdict.stage) == ("queue", "queue")  # 49 ms >= 15% of 150 + 50 ms

    calm = {"forward": flat, "queue": [(1, 0), (2, 0), (5, 0), (10, 0), (20, 100), ("+Inf", 100)]}
    stages, total = summarize(_answers(calm, q), window_s=60)
    verdict = decide_aggregate(stages, total, gpu_from_window(0.9, 100), 60)
    assert (verdict.cause, verdict.stage) == ("stable", None)
    assert "forward" in verdict.evidence[1] and verdict.advice


@pytest.mark.parametrize(
    "mean, samples, level",
    [
        (0.9, 50, "high"),
        (85.0, 50, "high"),
        (0.2, 50, "low"),
        (0.55, 50, "medium"),
        (0.9, 3, "thin"),
        (None, 0, "none"),
    ],
)
def test_gpu_level_from_the_window_mean(mean, samples, level):
    assert gpu_from_window(mean, samples).level == level


def test_forward_cause_follows_the_gpu_level():
    s = StageSummary(
        "forward", 100, 1.0, 300.0, 100.0, 200.0, 900.0, 950.0, swing_floor_ms=300.0, share=1.0
    )
    causes = [
        decide_aggregate({"forward": s}, None, gpu_from_window(m, 50), 60).cause
        for m in (0.9, 0.1, None)
    ]
    assert causes == ["gpu_busy", "gpu_starved", "forward"]


# --- parsing details ------------------------------------------------------------------------------


def test_jaeger_span_error_tags_short_ids_and_translator_tags():
    span = parse_jaeger_span(
        {
            "traceID": "1f",
            "spanID": "a",
            "operationName": "forward",
            "references": [
                {"refType": "FOLLOWS_FROM", "traceID": "1f", "spanID": "c"},
                {"refType": "CHILD_OF", "traceID": "1f", "spanID": "b"},
            ],
            "startTime": 1_700_000_000_123_456,
            "duration": 7,
            "tags": [
                {"key": "span.kind", "type": "string", "value": "internal"},
                {"key": "otel.status_code", "type": "string", "value": "ERROR"},
                {"key": "error", "type": "bool", "value": True},
                {"key": "batch.size", "type": "int64", "value": 4},
                {"key": "gpu.utilization.mean", "type": "float64", "value": 0.5},
            ],
            "processID": "p9",
        },
        {
            "p9": {
                "serviceName": "svc",
                "tags": [{"key": "service.instance.id", "type": "string", "value": "i-1"}],
            }
        },
    )
    assert span.trace_id == "0" * 30 + "1f" and span.span_id == "000000000000000a"
    assert span.parent_span_id == "000000000000000b"
    assert (span.start_ns, span.end_ns) == (1_700_000_000_123_456_000, 1_700_000_000_123_463_000)
    assert span.error and span.attributes == {"batch.size": 4, "gpu.utilization.mean": 0.5}
    assert span.resource == {"service.name": "svc", "service.instance.id": "i-1"}


def test_jaeger_response_problems():
    out = parse_jaeger_response(
        {
            "data": [{"traceID": "1", "spans": [{"spanID": "x"}], "processes": {}}],
            "errors": [{"code": 404, "msg": "trace not found", "traceID": "2"}],
        }
    )
    assert (
        out.spans == []
        and len(out.problems) == 2
        and "trace not found (trace 2)" in out.problems[0]
    )
    assert parse_jaeger_response({"traces": []}).problems


def test_tempo_v2_shape_and_partial_status():
    body = _recording("tempo_cold_start")
    v1 = next(iter(body["traces"].values()))
    v2 = {
        "trace": {"resourceSpans": v1["batches"]},
        "status": "PARTIAL",
        "message": "trace too large",
    }
    a, b = parse_tempo_trace(v1), parse_tempo_trace(v2)
    assert a.spans == b.spans and len(a.spans) == 6
    assert b.problems and "PARTIAL" in b.problems[0] and a.problems == []
    assert parse_tempo_trace({}).problems == ["tempo: empty trace"]


# --- Jaeger FOLLOWS_FROM and per-trace failures -------------------------------------------------


def test_jaeger_follows_from_keeps_the_span_in_its_request(server, capsys):
    """OpenTracing-style instrumentation: forward FOLLOWS_FROM its request instead of CHILD_OF.
    Jaeger's UI nests it under the request; so must the report (not a phantom request)."""
    code, child_of, _ = report_json([str(TRACES / "queue_batching.otlp.jsonl")], capsys)
    cassette = serve_jaeger(server, "queue_batching")
    for body in cassette["traces"].values():
        for span in body["data"][0]["spans"]:
            if span["operationName"] == "forward":
                for ref in span["references"]:
                    ref["refType"] = "FOLLOWS_FROM"
    code, out, err = report_json(["--jaeger", server.url, "--service", "vlm-server"], capsys)
    assert code == 0, err
    assert out["requests"] == 30 and _verdict(out) == ("queue", "queue")
    assert {n: s["share"] for n, s in out["stages"].items()} == pytest.approx(
        {n: s["share"] for n, s in child_of["stages"].items()}, abs=1e-3
    )
    spans = parse_jaeger_response(next(iter(cassette["traces"].values()))).spans
    forward = next(s for s in spans if s.name == "forward")
    request = next(s for s in spans if s.name == "request")
    assert forward.parent_span_id == request.span_id and forward.parent_follows_from
    assert not request.parent_follows_from


def test_a_follows_from_into_another_trace_is_not_a_parent():
    span = parse_jaeger_span(
        {
            "traceID": "1", "spanID": "a", "operationName": "forward", "startTime": 1, "duration": 1,
            "references": [{"refType": "FOLLOWS_FROM", "traceID": "2", "spanID": "b"}],
        }
    )
    assert span.parent_span_id is None and not span.parent_follows_from


@pytest.mark.parametrize(
    "source, status, body, says",
    [
        ("tempo", 422, "trace exceeds max size (max bytes: 5000000)", "HTTP 422"),
        ("jaeger", 500, {"data": None, "errors": [{"code": 500, "msg": "cassandra timeout"}]}, "cassandra timeout"),
    ],
)
def test_one_trace_that_cannot_be_read_is_a_problem_the_rest_is_reported(
    source, status, body, says, server, capsys
):
    cassette = (serve_tempo if source == "tempo" else serve_jaeger)(server, "queue_batching")
    bad = sorted(cassette["traces"])[3]
    good = dict(cassette["traces"])
    route = "/api/traces"

    def answer(rest: str, q: dict[str, list[str]]) -> tuple[int, object]:
        if not rest:
            return 200, cassette["search"]
        if rest == bad:
            return status, body
        return 200, good[rest]

    server.routes = [(p, h) for p, h in server.routes if p != route]
    server.route(route, answer)
    argv = [f"--{source}", server.url] + (["--service", "vlm-server"] if source == "jaeger" else [])
    code, out, err = report_json(argv, capsys)
    assert code == 0, err
    assert out["requests"] == 29 and _verdict(out) == ("queue", "queue")
    (problem,) = [p for p in out["problems"] if bad in p]
    assert f"{source}: trace {bad} could not be read" in problem and says in problem
    assert says in err


def test_every_trace_failing_is_an_error(server, capsys):
    cassette = serve_tempo(server, "cold_start")
    server.routes = [(p, h) for p, h in server.routes if p != "/api/traces"]
    server.route("/api/traces", lambda rest, q: (503, "tempo-querier unavailable"))
    code = main(["report", "--tempo", server.url, "--json"])
    err = capsys.readouterr().err
    assert code == 1
    assert "HTTP 503" in err and "tempo-querier unavailable" in err
    assert f"the other {len(cassette['traces']) - 1} traces failed too" in err


# --- Prometheus naming: found, not assumed ---------------------------------------------------------

#: Every naming the issue lists, as its Prometheus writes it.
NAMINGS = {
    "bundled (connector >= 0.109, OTLP with suffixes)": BUNDLED,
    "no namespace (connector < 0.109)": Naming("duration_milliseconds"),
    "Tempo metrics-generator traces_spanmetrics_latency (s, label service)": Naming(
        "traces_spanmetrics_latency", service_label="service", ms_per_unit=1000.0
    ),
    "traces_spanmetrics namespace (Alloy)": Naming("traces_spanmetrics_duration_milliseconds"),
    "OTLP without translation (NoTranslation)": Naming(
        "traces.span.metrics.duration", span_label="span.name", service_label="service.name",
        gpu="hw.gpu.utilization", metadata_unit="ms",
    ),
    "OTLP UTF-8 names with suffixes": Naming(
        "traces.span.metrics.duration_milliseconds", span_label="span.name",
        service_label="service.name", gpu="hw.gpu.utilization",
    ),
    "underscore escaping without unit suffixes": Naming(
        "traces_span_metrics_duration", gpu="hw_gpu_utilization"
    ),
    "seconds unit": Naming("traces_span_metrics_duration_seconds", ms_per_unit=1000.0),
    "old spanmetrics processor (latency, label operation)": Naming(
        "latency", span_label="operation"
    ),
}


@pytest.mark.parametrize("label", list(NAMINGS))
def test_prometheus_report_for_every_naming(label, make_server, capsys):
    naming = NAMINGS[label]
    bundled, variant = make_server(), make_server()
    serve_prometheus(bundled, "gpu_busy")
    serve_prometheus(variant, "gpu_busy", naming)
    code, expected, _ = report_json(["--prometheus", bundled.url, "--service", "vlm-server"], capsys)
    assert code == 0
    code, out, err = report_json(["--prometheus", variant.url, "--service", "vlm-server"], capsys)
    assert code == 0, err
    assert _verdict(out) == _verdict(expected) == ("gpu_busy", "forward")
    assert out["gpu"] == expected["gpu"] and out["requests"] == expected["requests"] == 30
    for name, stage in expected["stages"].items():
        for key, value in stage.items():
            got = out["stages"][name][key]
            assert got == value if value is None else got == pytest.approx(value, rel=1e-6), (name, key)
    said = [e for e in out["verdict"]["evidence"] if e.startswith("span metrics read from")]
    assert said and f"{naming.family}_bucket (labels {naming.span_label}, {naming.service_label}" in said[0]
    sent = [q["query"][0] for _, q in variant.paths("/api/v1/query")]
    assert sent == list(out["queries"].values())
    assert all(json.dumps(naming.family)[1:-1] in q for q in sent if "histogram" in q or "rate" in q)
    assert any(naming.gpu in q for q in sent)
    (_, names_q), = variant.paths("/api/v1/label/")
    assert set(names_q) == {"start", "end"} and int(names_q["end"][0]) - int(names_q["start"][0]) == 3600


def test_unit_unknown_from_the_name_comes_from_metadata_or_is_said_to_be_assumed(make_server, capsys):
    seconds = Naming("traces_span_metrics_duration", ms_per_unit=1000.0, metadata_unit="seconds")
    server = make_server()
    serve_prometheus(server, "queue_batching", seconds)
    code, out, _ = report_json(["--prometheus", server.url], capsys)
    assert code == 0 and _verdict(out) == ("queue", "queue")
    assert any("unit s)" in e for e in out["verdict"]["evidence"])
    assert server.paths("/api/v1/metadata")
    unknown = make_server()
    serve_prometheus(unknown, "queue_batching", Naming("traces_span_metrics_duration"))
    code, out, _ = report_json(["--prometheus", unknown.url], capsys)
    assert code == 0 and any("unit ms (assumed" in e for e in out["verdict"]["evidence"])


def test_overrides_metric_and_labels(make_server, capsys):
    custom = Naming("my_stage_time_seconds", span_label="name", service_label="svc", ms_per_unit=1000.0)
    server = make_server()
    serve_prometheus(server, "queue_batching", custom)
    code, out, _ = report_json(["--prometheus", server.url, "--service", "vlm-server"], capsys)
    assert code == 1 and "no span-metrics histogram" in " ".join(out["verdict"]["evidence"])
    argv = ["--prometheus", server.url, "--service", "vlm-server", "--metric",
            "my_stage_time_seconds_bucket", "--span-label", "name", "--service-label", "svc"]
    code, out, err = report_json(argv, capsys)
    assert code == 0, err
    assert _verdict(out) == ("queue", "queue")
    assert all('svc="vlm-server"' in q and 'name=~"' in q for q in out["queries"].values() if "rate(" in q)
    # a unit the name does not carry, forced
    ms = Naming("my_stage_time", span_label="name", service_label="svc")
    other = make_server()
    serve_prometheus(other, "queue_batching", ms)
    code, out, _ = report_json(["--prometheus", other.url, "--metric", "my_stage_time", "--metric-unit", "ms",
                                "--span-label", "name", "--service-label", "svc"], capsys)
    assert code == 0 and any("unit ms)" in e for e in out["verdict"]["evidence"])
    code, out, _ = report_json(["--prometheus", other.url, "--metric", "nope_seconds"], capsys)
    assert code == 1 and "--metric nope_seconds: Prometheus has no nope_seconds_bucket" in " ".join(
        out["verdict"]["evidence"]
    )


def test_two_families_present_the_current_one_is_used_and_the_other_named(server, capsys):
    serve_prometheus(server, "queue_batching", other_names=["latency_bucket", "latency_sum", "latency_count"])
    code, out, _ = report_json(["--prometheus", server.url], capsys)
    assert code == 0 and _verdict(out) == ("queue", "queue")
    assert any(e.startswith("also present: latency_bucket") for e in out["verdict"]["evidence"])


@pytest.mark.parametrize("label", [k for k, n in NAMINGS.items() if "." not in n.family])
def test_every_naming_query_parses_with_promtool(label, tmp_path):
    from otel_stages.analysis.promql import naming_for

    naming = NAMINGS[label]
    exprs = list(build_queries("vlm-server", 3600, naming_for(naming.family, span_label=naming.span_label,
                                                               service_label=naming.service_label),
                               naming.gpu).values())
    result = _promtool_check(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_utf8_names_use_the_quoted_selector():
    """Prometheus 3 syntax for dotted names (promtool 2.42 here predates it, so only the text)."""
    from otel_stages.analysis.promql import naming_for

    naming = naming_for("traces.span.metrics.duration", span_label="span.name", service_label="service.name")
    q = build_queries("svc", 60, naming, "hw.gpu.utilization")
    assert q["buckets"] == (
        'sum by (le, "span.name") (increase({"traces.span.metrics.duration_bucket",'
        ' "service.name"="svc", "span.name"=~"request|download|decode|resize|queue|forward"}[60s]))'
    )
    assert q["gpu_mean"] == ('avg(avg_over_time({"hw.gpu.utilization", job=~"svc|.+/svc",'
                             ' "hw.gpu.task"=~"|general"}[60s]))')
