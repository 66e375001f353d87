"""Stage maps: Triton's and vLLM's own traces (tests/server_traces.py builds them exactly as those
servers write them) get the same diagnosis as otel-stages' own spans, without re-instrumenting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_stages import semconv
from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.requests import find_requests
from otel_stages.analysis.stage_map import (
    StageMapError,
    apply_stage_map,
    load_stage_map,
    parse_stage_map,
)
from otel_stages.cli import main
from tests.server_traces import MS, triton_queue_scenario, vllm_decode_scenario


def _report(argv: list[str], capsys) -> tuple[int, dict, str]:
    code = main(["report", *argv, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else {}, out.err


def test_triton_traces_without_a_map_are_not_understood(tmp_path: Path, capsys):
    path = triton_queue_scenario(tmp_path / "triton.jsonl")
    code, out, _ = _report([str(path)], capsys)
    assert code == 1 and out["requests"] == 0  # no stage spans: Triton uses its own names


def test_triton_map_gives_the_queue_verdict(tmp_path: Path, capsys):
    path = triton_queue_scenario(tmp_path / "triton.jsonl")
    code, out, err = _report([str(path), "--stage-map", "triton"], capsys)
    assert code == 0, err
    assert out["stage_map"] == {"name": "triton", "requests_mapped": 31, "requests_unmapped": 0}
    assert out["requests"] == 31 and out["cold_start"] is not None
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("queue", "queue")
    stages = out["stages"]
    assert set(stages) == {"download", "queue", "compute_input", "forward", "compute_output", "respond"}
    assert stages["forward"]["median_ms"] == pytest.approx(20, abs=0.6)
    assert stages["download"]["median_ms"] == pytest.approx(0.4, abs=0.01)
    assert stages["compute_input"]["median_ms"] == pytest.approx(1.0, abs=0.01)
    assert out["cold_start"] is not None and out["cold_start"]["stages"]["forward"] == pytest.approx(900, abs=1)
    assert out["problems"] == []


def test_triton_stage_spans_come_from_the_events(tmp_path: Path):
    recording = load_paths([triton_queue_scenario(tmp_path / "t.jsonl", n=3)])
    mapped, summary = apply_stage_map(load_stage_map("triton"), recording)
    assert summary.mapped == 3 and summary.unmapped == 0
    (root,) = [s for s in recording.spans if s.name == "InferRequest" and s.start_ns == min(
        x.start_ns for x in recording.spans)]
    model = next(s for s in recording.spans if s.parent_span_id == root.span_id)
    compute = next(s for s in recording.spans if s.parent_span_id == model.span_id)
    ev = {e.name: e.time_ns for s in (root, model, compute) for e in s.events}
    kids = {s.name: s for s in mapped.spans if s.parent_span_id == root.span_id}
    assert (kids["queue"].start_ns, kids["queue"].end_ns) == (ev["QUEUE_START"], ev["COMPUTE_START"])
    assert (kids["forward"].start_ns, kids["forward"].end_ns) == (
        ev["COMPUTE_INPUT_END"], ev["COMPUTE_OUTPUT_START"])
    assert kids["forward"].attributes == {
        semconv.STAGE_MAP_SOURCE: "events COMPUTE_INPUT_END -> COMPUTE_OUTPUT_START"}
    request = next(s for s in mapped.spans if s.span_id == root.span_id)
    assert request.name == "request" and request.start_ns == ev["HTTP_RECV_START"] < root.start_ns
    assert request.end_ns == root.end_ns and request.resource == root.resource
    # the model and compute spans are replaced by the stages: nothing counted twice
    assert not any(s.name in ("compute", "vit_encoder") for s in mapped.spans)
    (req,) = [r for r in find_requests(mapped.spans) if r.span_id == root.span_id]
    assert sum(req.stages_ms.values()) < req.total_ms


def test_triton_ensemble_counts_each_model_once(tmp_path: Path, capsys):
    """The ensemble span has QUEUE_START but no compute of its own; its step's COMPUTE_START must
    not close the ensemble's 'queue' (that would count the step's queue and compute again)."""
    path = triton_queue_scenario(tmp_path / "ens.jsonl", ensemble="vit_pipeline")
    code, out, err = _report([str(path), "--stage-map", "triton"], capsys)
    assert code == 0, err
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("queue", "queue")
    plain = triton_queue_scenario(tmp_path / "plain.jsonl")
    _, flat, _ = _report([str(plain), "--stage-map", "triton"], capsys)
    assert out["stages"]["queue"]["median_ms"] == pytest.approx(flat["stages"]["queue"]["median_ms"], abs=0.05)


def test_vllm_map_gives_the_forward_verdict(tmp_path: Path, capsys):
    path = vllm_decode_scenario(tmp_path / "vllm.jsonl")
    code, out, err = _report([str(path), "--stage-map", "vllm"], capsys)
    assert code == 0, err
    assert out["stage_map"]["requests_mapped"] == 30
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("forward", "forward")
    assert set(out["stages"]) == {"queue", "forward", "input_processing"}
    assert out["stages"]["queue"]["median_ms"] == pytest.approx(3.5, abs=0.6)
    assert out["stages"]["input_processing"]["median_ms"] == pytest.approx(13.4, abs=1.2)


def test_vllm_stages_laid_out_from_the_attributes(tmp_path: Path):
    recording = load_paths([vllm_decode_scenario(tmp_path / "v.jsonl", n=1)])
    (span,) = recording.spans
    mapped, _ = apply_stage_map(load_stage_map("vllm"), recording)
    kids = sorted((s for s in mapped.spans if s.parent_span_id == span.span_id), key=lambda s: s.start_ns)
    a = span.attributes
    assert [k.name for k in kids] == ["input_processing", "queue", "forward", "forward"]
    assert kids[-1].end_ns == span.end_ns  # decode ends with the span
    durations = [k.end_ns - k.start_ns for k in kids]
    assert durations[1:] == [
        round(a["gen_ai.latency.time_in_queue"] * 1e9),
        round(a["gen_ai.latency.time_in_model_prefill"] * 1e9),
        round(a["gen_ai.latency.time_in_model_decode"] * 1e9),
    ]
    assert kids[0].start_ns == span.start_ns and sum(durations) == span.end_ns - span.start_ns


def test_a_map_file_maps_span_names(tmp_path: Path, capsys):
    """A user's own server: 'fetch_image' / 'prep' / 'infer' spans under 'handle'."""
    spans = []
    for i in range(25):
        t = 1_790_000_000_000_000_000 + i * 500 * MS
        tid, rid = f"{i + 1:032x}", f"{i + 1:016x}"
        prep = 80 if i % 3 == 0 else 10
        spans += [
            {"traceId": tid, "spanId": rid, "name": "handle", "startTimeUnixNano": str(t),
             "endTimeUnixNano": str(t + (prep + 30) * MS)},
            {"traceId": tid, "spanId": f"{i + 1:015x}a", "parentSpanId": rid, "name": "prep",
             "startTimeUnixNano": str(t), "endTimeUnixNano": str(t + prep * MS)},
            {"traceId": tid, "spanId": f"{i + 1:015x}b", "parentSpanId": rid, "name": "infer",
             "startTimeUnixNano": str(t + prep * MS), "endTimeUnixNano": str(t + (prep + 30) * MS)},
        ]
    data = tmp_path / "own.jsonl"
    data.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}))
    mapfile = tmp_path / "own.yaml"
    mapfile.write_text(
        "name: own\nrequest: handle\nstages:\n  - {stage: resize, span: prep}\n  - {stage: forward, span: infer}\n"
    )
    code, out, err = _report([str(data), "--stage-map", str(mapfile)], capsys)
    assert code == 0, err
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("preprocess", "resize")
    json_map = tmp_path / "own.json"
    json_map.write_text(json.dumps({"name": "own", "request": ["handle"], "stages": [
        {"stage": "resize", "span": "prep"}, {"stage": "forward", "span": "infer"}]}))
    code, again, _ = _report([str(data), "--stage-map", str(json_map)], capsys)
    assert code == 0 and again["verdict"] == out["verdict"]


def test_wrong_map_and_unmapped_requests_are_problems(tmp_path: Path, capsys):
    path = vllm_decode_scenario(tmp_path / "vllm.jsonl", n=3)
    code, out, _ = _report([str(path), "--stage-map", "triton"], capsys)
    assert code == 1
    assert out["problems"][0] == (
        "stage map triton: no span named InferRequest (span names found: llm_request); is this the"
        " right map?"
    )
    # a Triton request cancelled in the queue: QUEUE_START and no compute at all
    recording = load_paths([triton_queue_scenario(tmp_path / "t.jsonl", n=2)])
    compute = {s.span_id for s in recording.spans if s.name == "compute"}
    recording.spans[:] = [s for s in recording.spans if s.span_id not in compute]
    mapped, summary = apply_stage_map(load_stage_map("triton"), recording)
    assert summary.mapped == 2  # download and respond still map
    assert all(r.stages_ms.get("queue") is None for r in find_requests(mapped.spans))


@pytest.mark.parametrize(
    "text, says",
    [
        ("name: x\nrequest: r\nstages: []\n", "'stages' must be a non-empty list"),
        ("name: x\nrequest: r\nstages:\n  - {stage: q}\n", "give exactly one of"),
        ("name: x\nrequest: r\nstages:\n  - {stage: q, from_event: A}\n", "from_event needs a to_event"),
        ("name: x\nrequest: r\nstages:\n  - {stage: q, attribute: a, unit: h}\n", "'unit' must be one of"),
        ("name: x\nrequest: r\nstages:\n  - {stage: q, span: a, colour: red}\n", "unknown key(s) colour"),
        ("name: x\nrequest: r\nlayout: middle\nstages:\n  - {stage: q, span: a}\n", "'layout' must be"),
        ("request: r\nstages:\n  - {stage: q, span: a}\n", "'name' must be"),
        ("name: x\nstages:\n  - {stage: q, span: a}\n", "'request' must be"),
        ("name: x\nrequest: r\nstages:\n  - {stage: request, span: a}\n", "cannot be named 'request'"),
        ("[unclosed", "not YAML or JSON"),
    ],
)
def test_bad_maps_are_named_errors(text, says):
    with pytest.raises(StageMapError, match=None) as info:
        parse_stage_map(text, where="m.yaml")
    assert str(info.value).startswith("m.yaml") and says in str(info.value)


def test_builtin_maps_load_and_bad_name_is_a_usage_error(capsys):
    assert load_stage_map("triton").request == {"InferRequest"}
    assert load_stage_map("vllm").request == {"llm_request"}
    existing = str(Path(__file__).parent / "data" / "traces" / "stable.otlp.jsonl")
    assert main(["report", existing, "--stage-map", "tgi"]) == 2
    assert "built-in maps: triton, vllm" in capsys.readouterr().err


def test_a_map_changes_nothing_outside_its_requests(tmp_path: Path):
    own = load_paths([Path(__file__).parent / "data" / "traces" / "gpu_busy.otlp.jsonl"])
    mapped, summary = apply_stage_map(load_stage_map("vllm"), own)
    assert sorted(mapped.spans, key=lambda s: s.span_id) == sorted(own.spans, key=lambda s: s.span_id)
    assert diagnose(mapped).verdict.cause == diagnose(own).verdict.cause
    assert summary.mapped == 0 and len(summary.problems) == 1
