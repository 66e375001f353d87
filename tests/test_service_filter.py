"""``--service NAME`` on trace files and on ClickHouse: the requests of that service, with their
stage spans of other services (a trace of one request keeps all its spans; other services'
requests in the same trace are left out: tests/test_service_calls.py), and, when no span is of
it, the same sentence from both naming the services seen (not a bare "no requests found")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from otel_stages import semconv
from otel_stages.analysis.model import MetricPoint, Recording, Span
from otel_stages.analysis.services import no_service_line, pick_service, spans_by_service
from otel_stages.cli import main

TRACES = Path(__file__).parent / "data" / "traces"
GPU_BUSY = TRACES / "gpu_busy.otlp.jsonl"
NOSUCH = "no span of service 'nosuch'; services seen: ocr-server (180 spans), vlm-server (180 spans)"


def _renamed(source: Path, target: Path, service: str, prefix: str) -> Path:
    """``source`` as sent by ``service`` (its trace and span ids changed by ``prefix``)."""
    out = []
    for line in source.read_text().splitlines():
        doc = json.loads(line)
        for rs in doc.get("resourceSpans", []) + doc.get("resourceMetrics", []):
            for attr in rs["resource"]["attributes"]:
                if attr["key"] == semconv.SERVICE_NAME:
                    attr["value"] = {"stringValue": service}
            for ss in rs.get("scopeSpans", []):
                for span in ss["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):
                            span[key] = prefix + span[key][len(prefix):]
        out.append(json.dumps(doc))
    target.write_text("\n".join(out) + "\n")
    return target


@pytest.fixture(scope="module")
def two_services(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpu_busy under vlm-server, stable under ocr-server: 180 spans each."""
    folder = tmp_path_factory.mktemp("svc")
    mixed = folder / "two_services.jsonl"
    other = _renamed(TRACES / "stable.otlp.jsonl", folder / "ocr.jsonl", "ocr-server", "ee")
    mixed.write_text(GPU_BUSY.read_text() + other.read_text())
    return mixed


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "DB::Exception" not in out.err
    return code, out.out, out.err


def test_the_file_report_names_the_services_seen(two_services: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["report", str(two_services), "--service", "nosuch"], capsys)
    assert code == 1 and out == ""
    assert err.strip().endswith(f"no requests found in {two_services}: {NOSUCH}")
    code, out, err = _run(["report", str(two_services), "--service", "nosuch", "--json"], capsys)
    assert code == 1 and json.loads(out)["requests"] == 0 and NOSUCH in err


def test_the_file_report_picks_the_service(two_services: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["report", str(two_services), "--service", "vlm-server", "--json"], capsys)
    got = json.loads(out)
    code_all, out_all, _ = _run(["report", str(GPU_BUSY), "--json"], capsys)
    want = json.loads(out_all)
    assert code == code_all == 0
    assert (got["requests"], got["verdict"], got["gpu"]) == (want["requests"], want["verdict"], want["gpu"])


def test_since_still_needs_a_remote_source(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["report", str(GPU_BUSY), "--since", "1h"], capsys)
    assert code == 2 and "--since goes with" in err


def test_pick_service_keeps_whole_traces_and_their_services_gpu_points() -> None:
    """A trace with a span of the service keeps its spans of other services (a GPU worker), and
    the points of the services in the picked traces stay; other services' go."""
    web, gpu, other = ({semconv.SERVICE_NAME: n} for n in ("web", "gpu-worker", "batch"))
    spans = [Span("t1", "a", None, "request", 1, 10, {}, web),
             Span("t1", "b", "a", "forward", 2, 9, {}, gpu),
             Span("t2", "c", None, "request", 1, 10, {}, other)]
    points = [MetricPoint(semconv.HW_GPU_UTILIZATION, 5, 0.5, {}, r) for r in (gpu, other)]
    picked = pick_service(Recording(spans, points, ["p"]), "web")
    assert [s.span_id for s in picked.spans] == ["a", "b"]
    assert [p.resource for p in picked.metrics] == [gpu]
    assert picked.problems == ["p"]
    assert spans_by_service(spans) == [("batch", 1), ("gpu-worker", 1), ("web", 1)]


def test_the_line_names_a_handful() -> None:
    seen = [(f"svc-{i}", 10 - i) for i in range(8)]
    line = no_service_line("x", seen, 8)
    assert line == ("no span of service 'x'; services seen: svc-0 (10 spans), svc-1 (9 spans),"
                    " svc-2 (8 spans), svc-3 (7 spans), svc-4 (6 spans) and 3 more")
    assert no_service_line("x", [("", 1)], 1) == "no span of service 'x'; services seen: (no service.name) (1 span)"
    assert no_service_line("x", [], 0) == "no span of service 'x': no spans at all"


try:
    import chdb  # noqa: F401
    HAS_CHDB = True
except ImportError:  # CI installs the test extra, which holds chDB: there it is a broken install
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        raise
    HAS_CHDB = False


@pytest.mark.skipif(not HAS_CHDB, reason="needs chDB: the clickhouse extra")
def test_clickhouse_names_the_same_services(two_services: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    url = f"chdb:{tmp_path / 'db'}"
    assert main(["import", str(two_services), "--clickhouse", url]) == 0
    capsys.readouterr()
    code, out, err = _run(["report", "--clickhouse", url, "--service", "nosuch"], capsys)
    assert code == 1 and out == ""
    assert err.strip().endswith(f"at {url}: {NOSUCH}")
    # a service with spans but no request: no list (the service is there)
    code, _, err = _run(["report", "--clickhouse", url, "--service", "vlm-server", "--json"], capsys)
    assert code == 0 and "services seen" not in err
