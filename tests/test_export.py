"""configure(): embedded OTLP/JSON files, and real OTLP over HTTP and gRPC to local receivers."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

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
                "OTEL_STAGES_ENABLED", "OTEL_STAGES_DATA_DIR", "OTEL_SERVICE_NAME",
                "OTEL_STAGES_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TIMEOUT",
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_STAGES_GPU"):
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
    telemetry.shutdown()
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


# -- configure() again, fork(), export failures -----------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _spans_by_service(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            attrs = {a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}
            names = [s["name"] for ss in rs["scopeSpans"] for s in ss["spans"]]
            out.setdefault(attrs["service.name"], []).extend(names)
    return out


def _sdk_threads() -> dict[str, int]:
    names = ("OtelBatchSpanRecordProcessor", "OtelPeriodicExportingMetricReader")
    return {n: sum(t.name == n and t.is_alive() for t in threading.enumerate()) for n in names}


def test_second_configure_shuts_down_the_first(tmp_path, clean_env, caplog):
    first = ots.configure(service_name="one", data_dir=tmp_path / "a", set_global=False, gpu="off")
    threads = _sdk_threads()
    _one_request()
    with caplog.at_level(logging.INFO, logger="otel_stages"):
        second = ots.configure(service_name="two", data_dir=tmp_path / "b", set_global=False,
                               gpu="off")
    assert _sdk_threads() == threads  # the first setup's export threads are gone, not doubled
    assert not first.tracer_provider.force_flush()  # its span processor is shut down
    replaced = [r for r in caplog.records if "replaced the previous configuration" in r.getMessage()]
    assert len(replaced) == 1 and replaced[0].levelno == logging.INFO
    assert "'one'" in replaced[0].getMessage() and "'two'" in replaced[0].getMessage()
    _one_request()
    assert second.force_flush()
    second.shutdown()
    second.shutdown()  # idempotent
    assert _spans_by_service(first.trace_path) == {"one": ["decode", "forward", "request"]}
    assert _spans_by_service(second.trace_path) == {"two": ["decode", "forward", "request"]}


def test_failed_reconfigure_keeps_the_previous_configuration(tmp_path, clean_env):
    first = ots.configure(service_name="one", data_dir=tmp_path / "a", set_global=False, gpu="off")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigurationError):
        ots.configure(data_dir=blocker / "sub", set_global=False, gpu="off")
    _one_request()
    assert first.force_flush()
    first.shutdown()
    assert _spans_by_service(first.trace_path) == {"one": ["decode", "forward", "request"]}


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_second_global_configure_warns_once_instead_of_overriding(tmp_path):
    done = _python("""
        import json, logging, sys
        from pathlib import Path
        from opentelemetry import trace
        import otel_stages as ots

        logging.basicConfig(level=logging.INFO)
        folder = Path(sys.argv[1])
        a = ots.configure(service_name="one", data_dir=folder / "a", gpu="off")
        b = ots.configure(service_name="two", data_dir=folder / "b", gpu="off")
        trace.get_tracer("other-instrumentation").start_span("global").end()
        with ots.request():
            pass
        a.force_flush()
        b.force_flush()
        print(json.dumps([str(a.trace_path), str(b.trace_path),
                          trace.get_tracer_provider() is a.tracer_provider]))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    a_path, b_path, global_is_first = json.loads(done.stdout)
    assert global_is_first
    assert "Overriding of current" not in done.stderr
    assert done.stderr.count("can be set only once per process") == 1
    assert "'one'" in done.stderr and "stay up as the OpenTelemetry globals" in done.stderr
    assert _spans_by_service(Path(a_path)) == {"one": ["global"]}  # the global keeps the first
    assert _spans_by_service(Path(b_path)) == {"two": ["request"]}  # our spans use the new one


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_after_configure_warns_once_in_child(tmp_path, clean_env):
    parent = ots.configure(service_name="forky", data_dir=tmp_path / "parent", set_global=False,
                           gpu="off")
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("otel_stages")
    log.addHandler(handler)
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # child: report through the pipe, never return into pytest
            code = 1
            try:
                os.close(read_fd)
                before = [r.getMessage() for r in records]  # nothing recorded yet: no warning
                with ots.request(request_id="from-child"):  # still the inherited configuration
                    pass
                with ots.request(request_id="from-child-2"):  # warned once, not per span
                    pass
                warned = [r.getMessage() for r in records]
                parent.force_flush()
                child = ots.configure(service_name="forky", data_dir=tmp_path / "child",
                                      set_global=False, gpu="off")
                _one_request()
                child.force_flush()
                result = {"before": before, "warned": warned, "pid": os.getpid(), "trace_path": str(child.trace_path),
                          "instance": child.tracer_provider.resource.attributes[
                              semconv.SERVICE_INSTANCE_ID]}
                child.shutdown()
                os.write(write_fd, json.dumps(result).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            raw = pipe.read()
        _, status = os.waitpid(pid, 0)
    finally:
        log.removeHandler(handler)
    assert os.waitstatus_to_exitcode(status) == 0, raw
    result = json.loads(raw)
    # the parent itself did not warn about fork (other warnings may come from threads that
    # earlier tests left running, e.g. a retrying exporter: not this test's subject)
    assert [r.getMessage() for r in records if "fork" in r.getMessage()] == []
    assert [m for m in result["before"] if "fork" in m] == []  # warned at its first span
    (warning,) = [m for m in result["warned"] if "fork" in m]
    parent_id = parent.tracer_provider.resource.attributes[semconv.SERVICE_INSTANCE_ID]
    assert warning.startswith(f"configure() ran before fork(): pid {result['pid']} inherited the "
                              f"configuration of pid {os.getpid()}; the OpenTelemetry SDK gives "
                              "its spans and metrics a new service.instance.id ")
    assert f"(pid {os.getpid()}'s: {parent_id})" in warning
    assert f"still go to the parent's files, {tmp_path / 'parent'}" in warning
    assert "Call otel_stages.configure() in each worker process (e.g. gunicorn post_fork)" in warning
    # what the warning says is what happened: the child's span, in the parent's file, carries
    # the new instance id the warning names
    parent.force_flush()
    by_instance: dict[str, list[str]] = {}
    for line in parent.trace_path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            attrs = {a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}
            for ss in rs["scopeSpans"]:
                by_instance.setdefault(attrs["service.instance.id"], []).extend(
                    s["name"] for s in ss["spans"])
    (child_id,) = [i for i in by_instance if i != parent_id]
    assert f"service.instance.id {child_id} " in warning and by_instance[child_id] == ["request", "request"]
    # configure() in the child: its own instance id and files
    assert result["instance"] != parent.tracer_provider.resource.attributes[semconv.SERVICE_INSTANCE_ID]
    child_path = Path(result["trace_path"])
    assert child_path.parent == tmp_path / "child" and f"-{result['pid']}-" in child_path.name
    assert _spans_by_service(child_path) == {"forky": ["decode", "forward", "request"]}
    parent.shutdown()


def test_fork_child_that_records_nothing_is_not_warned(tmp_path, clean_env):
    """A forked child that starts no span (a multiprocessing worker, a helper process) stays
    silent: the fork warning comes with the first span the child records."""
    parent = ots.configure(service_name="forky", data_dir=tmp_path, set_global=False, gpu="off")
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("otel_stages")
    log.addHandler(handler)
    try:
        pid = os.fork()
        if pid == 0:  # child: some work without spans, then the exit status says what it saw
            code = 3
            try:
                sum(range(1000))
                code = 0 if not [r for r in records if "fork" in r.getMessage()] else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        log.removeHandler(handler)
        parent.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_export_failures_count_undelivered_span_batches(tmp_path, clean_env, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.2")  # seconds: give up retrying quickly
    dead = ots.configure(endpoint=f"http://127.0.0.1:{_closed_port()}", data_dir=tmp_path,
                         set_global=False, gpu="off")
    assert dead.export_failures == 0
    _one_request()
    dead.force_flush(5_000)
    assert dead.export_failures == 1
    dead.shutdown()
    ok = ots.configure(data_dir=tmp_path, set_global=False, gpu="off")
    _one_request()
    assert ok.force_flush() and ok.export_failures == 0
    ok.shutdown()
    assert ots.configure(enabled=False, set_global=False).export_failures == 0


def test_second_configure_stops_gpu_export_and_does_not_repeat_nvml_warning(
        tmp_path, clean_env, monkeypatch, caplog):
    import functools

    from otel_stages.gpu import session
    from tests.fakegpu import FakeBackend

    reason = f"no driver on {tmp_path.name}"  # unique: the once-per-process memory is global
    monkeypatch.setattr(session, "start", functools.partial(
        session.start, backend_factory=lambda: FakeBackend([], unavailable=reason)))

    def export_threads(telemetry) -> list[threading.Thread]:
        threads = [reader._thread for reader in telemetry._gpu_readers]
        assert threads and all(t.name == "otel-stages-gpu-export" and t.is_alive() for t in threads)
        return threads

    def ended(threads: list[threading.Thread]) -> bool:
        for thread in threads:
            thread.join(5)  # told to stop by the shutdown; it exits on its own
        return not any(t.is_alive() for t in threads)

    with caplog.at_level(logging.WARNING, logger="otel_stages.gpu"):
        first = ots.configure(data_dir=tmp_path / "a", set_global=False, gpu="auto")
        assert not session.current().sampler.wait_ready(5)
        first_threads = export_threads(first)
        second = ots.configure(data_dir=tmp_path / "b", set_global=False, gpu="auto")
        assert not session.current().sampler.wait_ready(5)
        assert ended(first_threads)
        second_threads = export_threads(second)
        third = ots.configure(data_dir=tmp_path / "c", set_global=False, gpu="off")
        assert ended(second_threads) and third._gpu_readers == []
    lines = [r.getMessage() for r in caplog.records if reason in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("NVML unavailable")
    assert first._shut_down and second._shut_down
    third.shutdown()


def test_deployment_instance_id_from_resource_attributes_is_kept(tmp_path, clean_env, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-uid-123,k8s.pod.name=p1")
    telemetry = ots.configure(data_dir=tmp_path, gpu="off", set_global=False)
    _one_request()
    telemetry.shutdown()
    line = json.loads(telemetry.trace_path.read_text().splitlines()[0])
    resource = {a["key"]: a["value"] for a in line["resourceSpans"][0]["resource"]["attributes"]}
    assert resource["service.instance.id"] == {"stringValue": "pod-uid-123"}
    assert resource["k8s.pod.name"] == {"stringValue": "p1"}
    assert "pod-uid-" in telemetry.trace_path.name


def test_disabled_telemetry_flushes_true_and_counts_every_reason_as_zero(tmp_path, clean_env):
    from otel_stages import semconv as sc

    telemetry = ots.configure(enabled=False, data_dir=tmp_path, set_global=False)
    assert telemetry.force_flush(1000) is True  # nothing to flush, nothing lost
    assert telemetry.drops == {"spans": dict.fromkeys(sc.DROP_REASONS, 0),
                               "points": dict.fromkeys(sc.DROP_REASONS, 0)}
    assert telemetry.drops["spans"][sc.DROP_QUEUE_FULL] == 0
    telemetry.shutdown()
    assert telemetry.force_flush(1000) is False  # after shutdown


def test_trace_ids_do_not_follow_the_global_random_seed(tmp_path, clean_env):
    """The tester's seeded workers: ML code calls random.seed(0) in every worker, and the SDK's
    default generator draws ids from the global random, so two workers gave the same trace ids
    and the report merged them. configure()'s providers draw from their own generator."""
    import random

    telemetry = ots.configure(service_name="seeded", data_dir=tmp_path, set_global=False, gpu="off")
    tracer = telemetry.tracer_provider.get_tracer("t")
    ids = []
    for _ in range(2):
        random.seed(0)
        span = tracer.start_span("request")
        ids.append((span.get_span_context().trace_id, span.get_span_context().span_id))
        span.end()
    telemetry.shutdown()
    assert ids[0] != ids[1]
    random.seed(0)
    first = random.getrandbits(128)
    random.seed(0)
    assert first == random.getrandbits(128)  # the user's stream is untouched by our ids


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_other_ids_than_its_parent():
    from otel_stages.sdk import IDS

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            os.write(write_fd, str(IDS.generate_trace_id()).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        child_id = int(pipe.read())
    os.waitpid(pid, 0)
    assert child_id != IDS.generate_trace_id()  # without the reseed both draw the same next id
