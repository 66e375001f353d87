"""configure(): embedded OTLP/JSON files, and real OTLP over HTTP and gRPC to local receivers."""

from __future__ import annotations

import json
import logging

import pytest

import otel_stages as ots
from otel_stages import semconv
from otel_stages._runtime import RUNTIME
from otel_stages.config import ConfigurationError
from tests.otlp_receiver import grpc_receiver, http_receiver


@pytest.fixture(autouse=True)
def restore_runtime():
    saved = (RUNTIME.tracer, RUNTIME.enabled)
    yield
    RUNTIME.tracer, RUNTIME.enabled = saved


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED",
                "OTEL_STAGES_ENABLED", "OTEL_STAGES_DATA_DIR", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(var, raising=False)


def _one_request() -> None:
    with ots.request(request_id="req-42"):
        with ots.stage("decode", **{semconv.IMAGE_SIZE: 1234, semconv.IMAGE_WIDTH: 64,
                                    semconv.IMAGE_HEIGHT: 48}):
            pass
        with ots.stage("forward"):
            pass


def test_embedded_default_writes_otlp_json_lines(tmp_path, clean_env):
    telemetry = ots.configure(service_name="svc-a", data_dir=tmp_path / "out", set_global=False)
    gauge = telemetry.meter_provider.get_meter("t").create_gauge("hw.gpu.utilization", unit="1")
    _one_request()
    gauge.set(0.5)
    assert telemetry.force_flush()
    telemetry.shutdown()
    assert telemetry.trace_path.parent == tmp_path / "out"
    lines = [json.loads(x) for x in telemetry.trace_path.read_text().splitlines()]
    spans = [s for line in lines for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    by_name = {s["name"]: s for s in spans}
    assert set(by_name) == {"request", "decode", "forward"}
    assert by_name["decode"]["parentSpanId"] == by_name["request"]["spanId"]
    resource = {a["key"]: a["value"] for a in lines[0]["resourceSpans"][0]["resource"]["attributes"]}
    assert resource["service.name"] == {"stringValue": "svc-a"}
    assert "service.instance.id" in resource
    metric_lines = [json.loads(x) for x in telemetry.metrics_path.read_text().splitlines()]
    names = {m["name"] for line in metric_lines for rm in line["resourceMetrics"]
             for sm in rm["scopeMetrics"] for m in sm["metrics"]}
    assert "hw.gpu.utilization" in names


def test_report_reads_what_configure_wrote(tmp_path, clean_env):
    from otel_stages.analysis import diagnose, load_paths

    telemetry = ots.configure(data_dir=tmp_path, set_global=False)
    ots.mark_cold_start()  # other tests in this process already sent requests
    for _ in range(4):
        _one_request()
    telemetry.force_flush()
    report = diagnose(load_paths([tmp_path])).to_dict()
    assert report["requests"] == 4  # every request; the first is also reported apart as cold
    assert report["cold_start"] is not None
    assert set(report["stages"]) == {"decode", "forward"}


def test_disabled_builds_nothing(tmp_path, clean_env, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    telemetry = ots.configure(data_dir=tmp_path / "never", set_global=False)
    assert telemetry.tracer_provider is None
    assert not (tmp_path / "never").exists()
    _one_request()  # still runs, as a no-op


def test_misconfiguration_fails_fast_at_configure(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_PROTOCOL='carrier-pigeon'"):
        ots.configure(set_global=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigurationError, match="data_dir"):
        ots.configure(data_dir=blocker / "sub", set_global=False)


def test_request_log_line(tmp_path, clean_env, caplog):
    telemetry = ots.configure(data_dir=tmp_path, log_requests=True, set_global=False)
    with caplog.at_level(logging.INFO, logger="otel_stages.requests"):
        _one_request()
    telemetry.shutdown()
    (record,) = [r for r in caplog.records if r.name == "otel_stages.requests"]
    line = json.loads(record.getMessage())
    assert line["request.id"] == "req-42"
    assert len(line["trace_id"]) == 32
    assert line["image.size"] == 1234 and line["image.width"] == 64 and line["image.height"] == 48
    assert set(line["stages_ms"]) == {"decode", "forward"}
    assert line["total_ms"] >= sum(line["stages_ms"].values())
    assert line["error"] is None


@pytest.mark.parametrize("protocol, receiver", [("http/protobuf", http_receiver), ("grpc", grpc_receiver)])
def test_otlp_export_to_real_receiver(protocol, receiver, clean_env, monkeypatch, tmp_path):
    with receiver() as (endpoint, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        telemetry = ots.configure(service_name="svc-otlp", data_dir=tmp_path, set_global=False)
        assert telemetry.trace_path is None and protocol in telemetry.destination
        counter = telemetry.meter_provider.get_meter("t").create_gauge(semconv.HW_GPU_UTILIZATION, unit="1")
        _one_request()
        counter.set(0.75, {semconv.HW_ID: "GPU-test"})
        assert telemetry.force_flush(10_000)
        telemetry.shutdown()
    assert received.span_names() == {"request", "decode", "forward"}
    spans = {s.name: s for req in received.traces for rs in req.resource_spans
             for ss in rs.scope_spans for s in ss.spans}
    assert spans["decode"].parent_span_id == spans["request"].span_id
    service = [a.value.string_value for req in received.traces for rs in req.resource_spans
               for a in rs.resource.attributes if a.key == "service.name"]
    assert service and set(service) == {"svc-otlp"}
    assert semconv.HW_GPU_UTILIZATION in received.metric_names()
    assert list(tmp_path.iterdir()) == []  # nothing written locally when exporting over OTLP
