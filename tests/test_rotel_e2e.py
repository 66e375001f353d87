"""End to end through a real collector: the demo's spans and GPU metrics go over OTLP to rotel
(a separately developed OTLP collector, shipped as a binary in the ``rotel`` wheel) on 127.0.0.1,
and rotel forwards them to a receiver this test controls (``tests/otlp_receiver.py``).

Both OTLP transports are crossed: the demo sends gRPC and rotel forwards OTLP/HTTP, then the demo
sends OTLP/HTTP and rotel forwards gRPC. rotel is stopped with SIGTERM (a graceful stop flushes its
batch) before anything is asserted, so no test waits for telemetry by sleeping.

The demo runs as ``python -m otel_stages.cli demo`` would, in a fresh process, with GPU sampling on
(``OTEL_STAGES_GPU=on``) against the stand-in ``libnvidia-ml.so.1`` of ``tests/fakenvml`` (two fake
GPUs, found through ``LD_LIBRARY_PATH``), so the ``hw.gpu.*`` points are the real sampler's. A thin
driver keeps a copy of every metrics request the demo's OTLP exporter sends (encoded as that
exporter encodes it); spans are compared with the OTLP/JSON copy the demo itself writes.

Without rotel (or gcc, for the fake library) the test is skipped, except under CI (``CI`` set),
where it fails.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_stages import semconv
from tests.otlp_receiver import Received, grpc_receiver, http_receiver

try:
    import rotel
except ImportError:  # binary wheels only: Linux x86_64/aarch64 (glibc 2.34+) and macOS
    rotel = None

ROOT = Path(__file__).resolve().parents[1]
FIXED, MIXED = 6, 4  # --requests / --mixed: 10 requests, one of them a truncated JPEG
SERVICE = "otel-stages-demo"
STAGES = set(semconv.STANDARD_STAGES)
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 20.0
DEMO_TIMEOUT_S = 120.0
FAKE_GPUS = 2
FAKE_MODEL = "NVIDIA Fake H100"  # what tests/fakenvml/libnvidia-ml.c names its devices
FAKE_UUIDS = {f"GPU-fa4e0000-0000-0000-0000-00000000000{i}" for i in range(FAKE_GPUS)}

#: Runs the demo as the CLI does, keeping a copy of each metrics request its OTLP exporter sends
#: (length-prefixed serialized ExportMetricsServiceRequest) in argv[1]; argv[2:] are the CLI's.
DRIVER = r"""
import sys
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from otel_stages import sdk
from otel_stages.cli import main

copy_path = sys.argv[1]
real_exporters = getattr(sdk, "_exporters", None)
assert callable(real_exporters), "otel_stages.sdk._exporters is gone: update this test's driver"

def exporters(settings, instance_id):
    spans, points, handle = real_exporters(settings, instance_id)
    export = points.export

    def keep_copy(metrics_data, *args, **kwargs):
        body = encode_metrics(metrics_data).SerializeToString()
        with open(copy_path, "ab") as out:
            out.write(len(body).to_bytes(8, "big") + body)
        return export(metrics_data, *args, **kwargs)

    points.export = keep_copy
    return spans, points, handle

sdk._exporters = exporters
sys.exit(main(sys.argv[2:]))
"""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> None:
    if _in_ci():
        pytest.fail(f"{what}, and CI is set: CI must run the end-to-end export check")
    pytest.skip(what)


@pytest.fixture(scope="module")
def rotel_agent() -> Path:
    """The collector binary inside the rotel wheel."""
    if rotel is None:
        _missing("rotel is not installed (pip install rotel; wheels for Linux x86_64/aarch64 with "
                 "glibc 2.34+ and macOS): no real collector to export through")
    agent = Path(rotel.__file__).parent / "rotel-agent"
    assert os.access(agent, os.X_OK), f"the rotel package ships no runnable collector at {agent}"
    return agent


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the stand-in libnvidia-ml.so.1 (built with gcc)."""
    spec = importlib.util.spec_from_file_location("fakenvml_build", ROOT / "tests" / "fakenvml" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    try:
        return build.build(tmp_path_factory.mktemp("fakenvml"))
    except FileNotFoundError as exc:
        _missing(str(exc))
        raise


# --- rotel ---------------------------------------------------------------------------------------

@dataclass
class Collector:
    grpc_port: int
    http_port: int
    process: subprocess.Popen
    log: Path

    def endpoint(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _free_ports(n: int) -> list[int]:
    """n distinct ports free right now (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _listening(process: subprocess.Popen, ports: list[int], deadline: float) -> bool:
    """Poll until every port accepts a connection (True) or the process exits (False)."""
    pending = set(ports)
    while pending:
        if process.poll() is not None:
            return False
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"rotel did not listen on {sorted(pending)} within {START_TIMEOUT_S:.0f} s")
        for port in sorted(pending):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                pending.discard(port)
            except OSError:
                pass
        if pending:
            try:
                process.wait(timeout=0.02)  # the pause between polls, which also notices an exit
            except subprocess.TimeoutExpired:
                pass
    return process.poll() is None


@contextmanager
def rotel_collector(agent: Path, export_to: str, export_protocol: str, workdir: Path) -> Iterator[Collector]:
    """rotel in the foreground on two free 127.0.0.1 ports, its single OTLP exporter pointed at
    ``export_to`` (``export_protocol``: ``grpc`` or ``http``). Stopped with SIGTERM on exit; the
    test checks ``process.returncode`` afterwards."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")}
    for attempt in range(3):  # a free port can be taken between probing and rotel's bind
        grpc_port, http_port = _free_ports(2)
        log = workdir / f"rotel-{attempt}.log"
        command = [
            str(agent), "start",
            "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
            "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
            "--exporter", "otlp",
            "--otlp-exporter-endpoint", export_to,
            "--otlp-exporter-protocol", export_protocol,
            "--pid-file", str(workdir / "rotel.pid"),
            "--log-file", str(workdir / "rotel-daemon.log"),
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT)
        if _listening(process, [grpc_port, http_port], time.monotonic() + START_TIMEOUT_S):
            break
        text = log.read_text(errors="replace")
        if "in use" not in text.lower():
            pytest.fail(f"rotel exited at start (code {process.returncode}): {' '.join(command)}\n{text}")
    else:
        pytest.fail(f"rotel could not bind free ports in 3 attempts:\n{text}")
    collector = Collector(grpc_port, http_port, process, log)
    try:
        yield collector
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                pytest.fail(f"rotel ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s:\n{collector.output()}")


# --- the demo ----------------------------------------------------------------------------------

def _run_demo(endpoint: str, protocol: str, fake_nvml: Path, data_dir: Path,
              metrics_copy: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "FAKE_NVML_", "CUDA_", "ROTEL_"))}
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(fake_nvml), env.get("LD_LIBRARY_PATH")])),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_STAGES_GPU": "on",  # configure() fails rather than run on without GPU data
        "OTEL_STAGES_GPU_INTERVAL_S": "0.2",
        "FAKE_NVML_GPUS": str(FAKE_GPUS),
        "FAKE_NVML_PERIOD_MS": "250",  # utilization: a square wave, busy 250 ms, idle 250 ms
    })
    command = [sys.executable, "-c", DRIVER, str(metrics_copy), "demo", "--requests", str(FIXED),
               "--mixed", str(MIXED), "--data-dir", str(data_dir), "--json"]
    return subprocess.run(command, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=DEMO_TIMEOUT_S)


def _metrics_copy(path: Path) -> list[metrics_service_pb2.ExportMetricsServiceRequest]:
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 8], "big")
        out.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(data[at + 8:at + 8 + size]))
        at += 8 + size
    return out


# --- reading what arrived and the local copy ------------------------------------------------------

def _hex_to_b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def _local_copy(path: Path) -> list[trace_service_pb2.ExportTraceServiceRequest]:
    """The demo's OTLP/JSON copy (hex ids, as OTLP/JSON specifies) parsed into protobuf."""
    requests = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        for rs in obj["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):
                            span[key] = _hex_to_b64(span[key])
                    for link in span.get("links", []):
                        for key in ("traceId", "spanId"):
                            link[key] = _hex_to_b64(link[key])
        requests.append(json_format.ParseDict(obj, trace_service_pb2.ExportTraceServiceRequest()))
    return requests


def _any_value(value: common_pb2.AnyValue):  # type: ignore[no-untyped-def]
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(items) -> dict:  # type: ignore[no-untyped-def]
    return {kv.key: _any_value(kv.value) for kv in items}


@dataclass(frozen=True)
class Arrived:
    resource: dict
    scope: str
    span: trace_pb2.Span


def _spans(requests: list[trace_service_pb2.ExportTraceServiceRequest]) -> dict[bytes, Arrived]:
    """Span id -> span with its resource and scope; fails on a span that arrived twice."""
    out: dict[bytes, Arrived] = {}
    for request in requests:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    assert span.span_id not in out, f"span {span.span_id.hex()} ({span.name}) twice"
                    out[span.span_id] = Arrived(_attributes(rs.resource.attributes), ss.scope.name, span)
    return out


def _points(requests: list[metrics_service_pb2.ExportMetricsServiceRequest]) -> list[tuple]:
    """Every data point as a comparable tuple, sorted: (resource, scope, metric name, unit,
    attributes, start ns, time ns, value kind, value) for gauge and sum points; other kinds
    (histograms...) carry their serialized point as the value."""
    out = []
    for request in requests:
        for rm in request.resource_metrics:
            resource = tuple(sorted(_attributes(rm.resource.attributes).items()))
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    data = metric.WhichOneof("data")
                    for p in getattr(metric, data).data_points:
                        attributes = tuple(sorted(_attributes(p.attributes).items()))
                        if data in ("gauge", "sum"):
                            kind, value = p.WhichOneof("value"), getattr(p, p.WhichOneof("value"))
                        else:
                            kind, value = data, p.SerializeToString(deterministic=True)
                        out.append((resource, sm.scope.name, metric.name, metric.unit, attributes,
                                    p.start_time_unix_nano, p.time_unix_nano, kind, value))
    return sorted(out, key=repr)


def _metric_kinds(requests: list[metrics_service_pb2.ExportMetricsServiceRequest]) -> set[tuple]:
    """(name, description, unit, data kind) of every metric."""
    return {(m.name, m.description, m.unit, m.WhichOneof("data")) for request in requests
            for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


# --- the test ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("demo_protocol, rotel_protocol, receiver", [
    pytest.param("grpc", "http", http_receiver, id="demo-grpc-rotel-http"),
    pytest.param("http/protobuf", "grpc", grpc_receiver, id="demo-http-rotel-grpc"),
])
def test_demo_telemetry_arrives_intact_through_rotel(demo_protocol, rotel_protocol, receiver,
                                                      rotel_agent, fake_nvml, tmp_path):
    data_dir, metrics_copy = tmp_path / "data", tmp_path / "metrics-sent.bin"
    received: Received
    with receiver() as (receiver_endpoint, received):
        with rotel_collector(rotel_agent, receiver_endpoint, rotel_protocol, tmp_path) as collector:
            began_ns = time.time_ns()
            demo = _run_demo(collector.endpoint(demo_protocol), demo_protocol, fake_nvml, data_dir,
                             metrics_copy)
            ended_ns = time.time_ns()
        # rotel has exited (SIGTERM: it flushed and waited for its exports to be answered)
    rotel_log = collector.output()
    assert demo.returncode == 0, demo.stderr
    assert collector.process.returncode == 0, f"rotel exit code {collector.process.returncode}:\n{rotel_log}"
    assert f"traces exported to OTLP {demo_protocol} {collector.endpoint(demo_protocol)}" in demo.stderr
    assert json.loads(demo.stdout)["requests"] == FIXED + MIXED  # the report, from the local copy

    # Everything at the receiver came through rotel (its exporter's user agent), none directly.
    assert received.traces and received.metrics, f"nothing arrived; rotel said:\n{rotel_log}"
    assert all(ua.startswith("Rotel") for ua in received.user_agents), set(received.user_agents)

    # --- spans: the same set as the demo's local copy, every field intact ----------------------
    (copy,) = data_dir.glob("traces-*-demo-copy.jsonl")
    local = _spans(_local_copy(copy))
    arrived = _spans(received.traces)
    assert set(arrived) == set(local), (
        f"{len(set(local) - set(arrived))} spans missing, {len(set(arrived) - set(local))} unexpected")
    for span_id, came in arrived.items():
        want = local[span_id]
        assert (came.span.start_time_unix_nano, came.span.end_time_unix_nano) == (
            want.span.start_time_unix_nano, want.span.end_time_unix_nano), came.span.name
        assert came.span == want.span, f"{came.span.name} {span_id.hex()} changed on the way"
        assert (came.resource, came.scope) == (want.resource, want.scope)
    resources = {tuple(sorted(a.resource.items())) for a in arrived.values()}
    assert len(resources) == 1  # one process, one resource
    resource = next(iter(arrived.values())).resource
    assert resource[semconv.SERVICE_NAME] == SERVICE and resource[semconv.SERVICE_INSTANCE_ID]
    assert {a.scope for a in arrived.values()} == {semconv.SCOPE_NAME}

    # --- spans: the shape of every request -----------------------------------------------------
    spans = [a.span for a in arrived.values()]
    requests = {s.span_id: s for s in spans if s.name == semconv.SPAN_REQUEST}
    assert len(requests) == FIXED + MIXED
    children: dict[bytes, dict[str, trace_pb2.Span]] = {rid: {} for rid in requests}
    for span in spans:
        if span.name == semconv.SPAN_REQUEST:
            assert not span.parent_span_id  # a root
            continue
        if span.name == semconv.SPAN_BATCH:  # a root of its own, linked to the requests it served
            assert not span.parent_span_id and span.links
            assert all(link.span_id in requests for link in span.links)
            continue
        assert span.parent_span_id in requests, f"{span.name} has no request parent"
        parent = requests[span.parent_span_id]
        assert span.trace_id == parent.trace_id
        assert span.name not in children[parent.span_id], f"two {span.name} spans in one request"
        children[parent.span_id][span.name] = span
    attrs = {sid: _attributes(s.attributes) for sid, s in requests.items()}
    seqs = sorted(a[semconv.REQUEST_SEQ] for a in attrs.values())
    assert all(isinstance(n, int) for n in seqs) and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    cold = [sid for sid, a in attrs.items() if a[semconv.REQUEST_COLD_START] is True]
    assert all(isinstance(a[semconv.REQUEST_COLD_START], bool) for a in attrs.values())
    assert len(cold) == 1 and attrs[cold[0]][semconv.REQUEST_SEQ] == seqs[0]  # the first is cold
    failed = [rid for rid, kids in children.items() if set(kids) != STAGES]
    assert len(failed) == 1  # the truncated JPEG: failed in decode, nothing after it
    broken = children[failed[0]]
    assert set(broken) == {semconv.STAGE_DOWNLOAD, semconv.STAGE_DECODE}
    assert broken[semconv.STAGE_DECODE].status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert broken[semconv.STAGE_DECODE].status.message.startswith("ImageDecodeError: corrupt or truncated")
    assert requests[failed[0]].status.code == trace_pb2.Status.STATUS_CODE_ERROR
    for rid, kids in children.items():
        if rid == failed[0]:
            continue
        assert requests[rid].status.code != trace_pb2.Status.STATUS_CODE_ERROR
        decode = _attributes(kids[semconv.STAGE_DECODE].attributes)
        for key in (semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT, semconv.IMAGE_SIZE):
            assert isinstance(decode[key], int) and decode[key] > 0, (key, decode)
        if attrs[rid]["demo.image"] == "/img/fixed.jpg":
            assert (decode[semconv.IMAGE_WIDTH], decode[semconv.IMAGE_HEIGHT]) == (1024, 768)
        assert _attributes(kids[semconv.STAGE_DOWNLOAD].attributes)[semconv.IMAGE_SIZE] == decode[semconv.IMAGE_SIZE]
        batch = _attributes(kids[semconv.STAGE_FORWARD].attributes)[semconv.BATCH_SIZE]
        depth = _attributes(kids[semconv.STAGE_QUEUE].attributes)[semconv.QUEUE_DEPTH]
        assert isinstance(batch, int) and batch >= 1 and isinstance(depth, int) and depth >= 0
        for kid in kids.values():
            assert kid.end_time_unix_nano >= kid.start_time_unix_nano > 0

    # --- GPU metrics: exactly the points the exporter sent, attributes and timestamps intact -----
    sent_requests = _metrics_copy(metrics_copy)
    sent, got = _points(sent_requests), _points(received.metrics)
    assert sent and got == sent, f"{len(sent)} points sent, {len(got)} arrived"
    assert _metric_kinds(received.metrics) == _metric_kinds(sent_requests)
    gpu = [p for p in got if p[2].startswith("hw.gpu.")]
    assert all(p[7] in ("as_double", "as_int") for p in gpu), "hw.gpu.* must be gauges"
    series = {(name, dict(attributes)[semconv.HW_ID]) for _, _, name, _, attributes, *_ in gpu}
    assert series >= {(name, hw_id) for name in (semconv.HW_GPU_UTILIZATION, semconv.HW_GPU_MEMORY_USAGE)
                      for hw_id in FAKE_UUIDS}
    times: dict[tuple, list[int]] = {}
    for resource_items, scope, name, unit, attributes, _start, at, kind, value in gpu:
        point = dict(attributes)
        assert point[semconv.HW_ID] in FAKE_UUIDS
        assert {k: point[k] for k in (semconv.HW_TYPE, semconv.HW_VENDOR, semconv.HW_MODEL)} == {
            semconv.HW_TYPE: semconv.HW_TYPE_GPU, semconv.HW_VENDOR: "NVIDIA", semconv.HW_MODEL: FAKE_MODEL}
        assert dict(resource_items) == resource and scope == semconv.SCOPE_NAME
        assert began_ns <= at <= ended_ns, (name, at)  # a sample time inside the run
        times.setdefault((name, point[semconv.HW_ID]), []).append(at)
        if name == semconv.HW_GPU_UTILIZATION:
            assert (unit, kind) == (semconv.UNIT_RATIO, "as_double") and 0.0 <= value <= 1.0
        elif name == semconv.HW_GPU_MEMORY_USAGE:
            assert (unit, kind) == (semconv.UNIT_BYTES, "as_int") and value > 0
    for key, stamps in times.items():
        assert len(stamps) == len(set(stamps)), f"{key}: a sample time twice"
    busy = {value for _, _, name, _, _, _, _, _, value in gpu if name == semconv.HW_GPU_UTILIZATION}
    assert len(busy) > 1  # the square wave: samples keep their own values, not one last value
