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
from otel_stages.analysis.stats import order_stages, pipeline_order
from otel_stages.cli import main
from tests.server_traces import (
    MS,
    T0_NS,
    VLLM_RESOURCE,
    _export,
    triton_queue_scenario,
    vllm_decode_scenario,
    vllm_request,
    vllm_v0_queue_scenario,
    vllm_v0_request,
)


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
    assert set(out["stage_map"].pop("labels")["forward"]) == {"vit_encoder"}  # per model
    assert out["stage_map"] == {"name": "triton", "requests_mapped": 31, "requests_unmapped": 0}
    assert out["requests"] == 31 and out["cold_start"] is not None
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("queue", "queue")
    stages = out["stages"]
    assert list(stages) == ["download", "queue", "compute_input", "forward", "compute_output", "respond"]
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
        semconv.STAGE_MAP_SOURCE: "events COMPUTE_INPUT_END -> COMPUTE_OUTPUT_START",
        "triton.model_name": "vit_encoder"}
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
    assert out["stage_map"] == {"name": "vllm", "requests_mapped": 30, "requests_unmapped": 0,
                                "variants": {"v1": 30, "v0": 0}}
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("forward", "forward")
    assert list(out["stages"]) == ["api_server", "queue", "forward"]  # the map's order
    assert out["stages"]["queue"]["median_ms"] == pytest.approx(3.5, abs=0.6)
    assert out["stages"]["api_server"]["median_ms"] == pytest.approx(13.4, abs=1.2)


def test_vllm_stages_laid_out_from_the_attributes(tmp_path: Path):
    recording = load_paths([vllm_decode_scenario(tmp_path / "v.jsonl", n=1)])
    (span,) = recording.spans
    mapped, _ = apply_stage_map(load_stage_map("vllm"), recording)
    kids = sorted((s for s in mapped.spans if s.parent_span_id == span.span_id), key=lambda s: s.start_ns)
    a = span.attributes
    assert [k.name for k in kids] == ["api_server", "queue", "forward", "forward"]
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
        " right map? These spans match --stage-map vllm."
    )
    code, out, _ = _report([str(path), "--stage-map", "vllm"], capsys)
    assert code == 0 and not any("--stage-map" in p for p in out["problems"])


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
        ("name: x\nrequest: r\nstages:\n  - {stage: q, span: a}\nvariants: []\n",
         "give either 'stages' or 'variants'"),
        ("name: x\nrequest: r\n", "give either 'stages' or 'variants'"),
        ("name: x\nrequest: r\nvariants: []\n", "'variants' must be a non-empty list"),
        ("name: x\nrequest: r\nvariants:\n  - {stages: [{stage: q, span: a}]}\n",
         "variants[0]: 'name' must be"),
        ("name: x\nrequest: r\nvariants:\n  - {name: a, stages: [{stage: q, span: a}]}\n"
         "  - {name: a, stages: [{stage: q, span: b}]}\n", "variants[1]: variant name 'a' is used twice"),
        ("name: x\nrequest: r\nvariants:\n  - {name: a, colour: red, stages: [{stage: q, span: a}]}\n",
         "variants[0]: unknown key(s) colour"),
        ("name: x\nrequest: r\nvariants:\n  - {name: a, layout: middle, stages: [{stage: q, span: a}]}\n",
         "variants[0]: 'layout' must be"),
        ("name: x\nrequest: r\nvariants:\n  - {name: a, stages: [{stage: q, span: a, minus: b}]}\n",
         "variants[0]: stages[0]: 'minus' goes with 'attribute'"),
        ("name: x\nrequest: r\nstages:\n  - {stage: q, attribute: a, minus: 3}\n",
         "'minus' must be an attribute name or a list of them"),
        ("name: x\nrequest: r\nstages:\n  - {stage: q, span: a, unfinished: cancelled}\n",
         "'unfinished' goes with from_event"),
    ],
)
def test_bad_maps_are_named_errors(text, says):
    with pytest.raises(StageMapError, match=None) as info:
        parse_stage_map(text, where="m.yaml")
    assert str(info.value).startswith("m.yaml") and says in str(info.value)


def test_builtin_maps_load_and_bad_name_is_a_usage_error(capsys):
    assert load_stage_map("triton").request == {"InferRequest"}
    assert load_stage_map("vllm").request == {"llm_request"}
    assert [v.name for v in load_stage_map("vllm").variants] == ["v1", "v0"]
    minus = parse_stage_map("name: x\nrequest: r\nstages:\n  - {stage: f, attribute: a, minus: [b, c]}\n")
    assert minus.attribute_keys() == {"a", "b", "c"} and minus.variants[0].name == "x"
    existing = str(Path(__file__).parent / "data" / "traces" / "stable.otlp.jsonl")
    assert main(["report", existing, "--stage-map", "tgi"]) == 2
    assert "built-in maps: triton, vllm" in capsys.readouterr().err


def test_a_map_changes_nothing_outside_its_requests(tmp_path: Path):
    own = load_paths([Path(__file__).parent / "data" / "traces" / "gpu_busy.otlp.jsonl"])
    mapped, summary = apply_stage_map(load_stage_map("vllm"), own)
    assert sorted(mapped.spans, key=lambda s: s.span_id) == sorted(own.spans, key=lambda s: s.span_id)
    assert diagnose(mapped).verdict.cause == diagnose(own).verdict.cause
    assert summary.mapped == 0 and len(summary.problems) == 1


# --- vLLM V0: no prefill/decode attributes (issue 8, tester case 6) ----------------------------------


def _write(path: Path, spans: list[dict]) -> Path:
    path.write_text("\n".join(_export(VLLM_RESOURCE, "vllm.llm_engine", [s]) for s in spans) + "\n")
    return path


def _without(span: dict, *keys: str) -> dict:
    return {**span, "attributes": [a for a in span["attributes"] if a["key"] not in keys]}


def test_vllm_v0_spans_map_from_the_times_since_arrival(tmp_path: Path):
    """V0's create_trace_span (vllm/engine/llm_engine.py) writes time_in_queue, time_to_first_token
    and e2e, all from arrival: queue, then prefill up to the first token, then decode, back to
    back from the span's start; nothing is input processing."""
    import random

    span, _ = vllm_v0_request(random.Random(1), T0_NS, queue_s=0.25, prefill_s=0.085,
                              decode_s=0.64, completion_tokens=64, detailed=True)
    recording = load_paths([_write(tmp_path / "v0.jsonl", [span])])
    (req,) = recording.spans
    assert "gen_ai.latency.time_in_model_prefill" not in req.attributes
    mapped, summary = apply_stage_map(load_stage_map("vllm"), recording)
    assert summary.by_variant == {"v1": 0, "v0": 1} and summary.unmapped == 0
    kids = sorted((s for s in mapped.spans if s.parent_span_id == req.span_id), key=lambda s: s.start_ns)
    got = [(k.name, k.start_ns - req.start_ns, k.end_ns - req.start_ns) for k in kids]
    a = req.attributes
    queue, ttft, e2e = (round(a[f"gen_ai.latency.{k}"] * 1e9) for k in ("time_in_queue", "time_to_first_token", "e2e"))
    assert [n for n, _, _ in got] == ["queue", "forward", "forward"]
    for (_, start, end), (want_start, want_end) in zip(got, [(0, queue), (queue, ttft), (ttft, e2e)]):
        assert abs(start - want_start) <= 1 and abs(end - want_end) <= 1
    assert kids[1].attributes[semconv.STAGE_MAP_SOURCE] == (
        "attribute gen_ai.latency.time_to_first_token - gen_ai.latency.time_in_queue (s)")
    (request,) = find_requests(mapped.spans)
    assert request.unaccounted_ms == pytest.approx(0.3, abs=0.01)  # e2e -> the span's end


def test_vllm_v0_report_gives_the_queue_verdict(tmp_path: Path, capsys):
    path = vllm_v0_queue_scenario(tmp_path / "v0.jsonl")
    code, out, err = _report([str(path), "--stage-map", "vllm"], capsys)
    assert code == 0, err
    assert out["stage_map"]["variants"] == {"v1": 0, "v0": 30}
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("queue", "queue")
    assert list(out["stages"]) == ["queue", "forward"] and out["problems"] == []
    assert out["stages"]["forward"]["median_ms"] == pytest.approx(85 + 1 + 640 + 2.5, abs=3)


def test_vllm_v1_and_v0_spans_in_one_file_each_map_by_their_own_variant(tmp_path: Path):
    import random

    rng = random.Random(2)
    v1, _ = vllm_request(rng, T0_NS, preprocess_s=0.01, queue_s=0.003, prefill_s=0.08,
                         decode_s=0.5, completion_tokens=50)
    v0, _ = vllm_v0_request(rng, T0_NS + 10**9, queue_s=0.013, prefill_s=0.08, decode_s=0.5,
                            completion_tokens=50)
    mapped, summary = apply_stage_map(
        load_stage_map("vllm"), load_paths([_write(tmp_path / "mix.jsonl", [v1, v0])]))
    assert summary.by_variant == {"v1": 1, "v0": 1}
    by_request = {r.start_ns: r.stages_ms for r in find_requests(mapped.spans)}
    assert by_request[T0_NS] == pytest.approx({"api_server": 10.4, "queue": 3, "forward": 580})
    assert by_request[T0_NS + 10**9] == pytest.approx({"queue": 13, "forward": 580})


@pytest.mark.parametrize(
    "drop, says",
    [
        # V0 shape without time_to_first_token: neither variant can lay out the model time
        (("gen_ai.latency.time_to_first_token",),
         "not v1: no attribute gen_ai.latency.time_in_model_prefill,"
         " gen_ai.latency.time_in_model_decode on the request span; not v0: no attribute"
         " gen_ai.latency.time_to_first_token on the request span"),
        (("gen_ai.latency.e2e",), "not v0: no attribute gen_ai.latency.e2e on the request span"),
    ],
)
def test_vllm_span_without_the_model_times_is_left_out_and_named(tmp_path: Path, capsys, drop, says):
    """Never all model time in api_server (the rest stage): a request missing an attribute
    stage's attribute is left out, and the problem names what is missing."""
    import random

    rng = random.Random(3)
    spans = [vllm_v0_request(rng, T0_NS + i * 10**9, queue_s=0.01, prefill_s=0.08, decode_s=0.5,
                             completion_tokens=50)[0] for i in range(6)]
    spans[2] = _without(spans[2], *drop)
    path = _write(tmp_path / "v0.jsonl", spans)
    code, out, err = _report([str(path), "--stage-map", "vllm"], capsys)
    assert code == 0, err
    assert out["stage_map"]["requests_unmapped"] == 1 and out["requests"] == 5
    (problem,) = out["problems"]
    assert problem.startswith("stage map vllm: 1 of 6 request span(s) left out of the timings: ")
    assert says in problem
    assert "api_server" not in out["stages"]


def test_a_negative_derived_duration_leaves_the_request_out(tmp_path: Path):
    import random

    span, _ = vllm_v0_request(random.Random(4), T0_NS, queue_s=0.2, prefill_s=0.08, decode_s=0.5,
                              completion_tokens=50)
    for a in span["attributes"]:  # wall-clock step back between arrival and the first token
        if a["key"] == "gen_ai.latency.time_to_first_token":
            a["value"] = {"doubleValue": 0.1}
    mapped, summary = apply_stage_map(
        load_stage_map("vllm"), load_paths([_write(tmp_path / "neg.jsonl", [span])]))
    assert summary.unmapped == 1 and not find_requests(mapped.spans)
    assert ("gen_ai.latency.time_to_first_token - gen_ai.latency.time_in_queue (s) is negative"
            " (-0.1)") in summary.problems[0]


def test_every_attribute_stage_is_required_even_with_one_variant(tmp_path: Path):
    """A map file's only variant: the request missing the second attribute is left out rather
    than having that time counted as the rest stage."""
    mapfile = tmp_path / "m.yaml"
    mapfile.write_text(
        "name: own\nrequest: llm_request\nstages:\n  - {stage: prep, rest: true}\n"
        "  - {stage: queue, attribute: gen_ai.latency.time_in_queue}\n"
        "  - {stage: forward, attribute: gen_ai.latency.time_in_model_prefill}\n"
    )
    import random

    span, _ = vllm_v0_request(random.Random(5), T0_NS, queue_s=0.01, prefill_s=0.08,
                              decode_s=0.5, completion_tokens=50)
    _, summary = apply_stage_map(
        load_stage_map(str(mapfile)), load_paths([_write(tmp_path / "v.jsonl", [span])]))
    assert summary.to_dict() == {"name": "own", "requests_mapped": 0, "requests_unmapped": 1}
    assert summary.problems == [
        "stage map own: 1 of 1 request span(s) left out of the timings: no attribute"
        " gen_ai.latency.time_in_model_prefill on the request span"]


# --- Triton: queued but never computed (tester case 10) -----------------------------------------------


def test_triton_request_that_never_left_the_queue_is_left_out_and_counted(tmp_path: Path, capsys):
    """QUEUE_START and no COMPUTE_START: cancelled or timed out in the queue, or a response-cache
    hit (Triton records nothing for either and sets no span status). Its stage times are unknown:
    not a warm request, not a failed one; counted in a problem and in requests_unmapped."""
    path = triton_queue_scenario(tmp_path / "t.jsonl", not_computed=frozenset({5, 9}))
    code, out, err = _report([str(path), "--stage-map", "triton"], capsys)
    assert code == 0, err
    assert out["stage_map"].pop("labels")["forward"]["vit_encoder"]["requests"] == 28  # warm
    assert out["stage_map"] == {"name": "triton", "requests_mapped": 29, "requests_unmapped": 2}
    assert out["requests"] == 29 and out["counts"]["failed"] == 0
    assert out["problems"] == [
        "stage map triton: 2 of 31 request span(s) left out of the timings: QUEUE_START without a"
        " later COMPUTE_START (the queue step never finished: cancelled or timed out in the"
        " queue, or answered from the response cache)"
    ]
    assert (out["verdict"]["cause"], out["verdict"]["stage"]) == ("queue", "queue")


def test_triton_ensemble_step_that_never_computed_is_left_out(tmp_path: Path, capsys):
    """The ensemble's own span never has COMPUTE_START (not a problem); a step's model span
    without it is."""
    path = triton_queue_scenario(tmp_path / "e.jsonl", ensemble="vit_pipeline",
                                 not_computed=frozenset({4}))
    code, out, err = _report([str(path), "--stage-map", "triton"], capsys)
    assert code == 0, err
    assert out["stage_map"]["requests_unmapped"] == 1 and out["requests"] == 30
    assert len(out["problems"]) == 1 and "QUEUE_START without a later COMPUTE_START" in out["problems"][0]


# --- hints and order (tester cases 12 and 14) ------------------------------------------------------------


@pytest.mark.parametrize("server", ["triton", "vllm"])
def test_no_requests_suggests_the_builtin_map(tmp_path: Path, capsys, server):
    path = (triton_queue_scenario(tmp_path / "t.jsonl", n=3) if server == "triton"
            else vllm_decode_scenario(tmp_path / "v.jsonl", n=3))
    assert main(["report", str(path)]) == 1
    err = capsys.readouterr().err
    span = "InferRequest" if server == "triton" else "llm_request"
    assert (f"no requests found in {path}; the {span} spans look like {server}'s own traces: map"
            f" them to stages with --stage-map {server}") in err


def test_no_hint_for_spans_no_map_knows(tmp_path: Path, capsys):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [
        {"traceId": "1" * 32, "spanId": "2" * 16, "name": "GET /", "startTimeUnixNano": "1",
         "endTimeUnixNano": "2"}]}]}]}) + "\n")
    assert main(["report", str(path)]) == 1
    assert "--stage-map" not in capsys.readouterr().err


def test_stage_order_merges_a_map_into_the_standard_order():
    names = {"forward", "queue", "api_server", "tokenize", "decode"}
    assert order_stages(names) == ["decode", "queue", "forward", "api_server", "tokenize"]
    with pipeline_order(load_stage_map("vllm").stage_order()):
        assert order_stages(names) == ["decode", "api_server", "queue", "forward", "tokenize"]
        with pipeline_order(("forward", "queue")):  # the map wins where it disagrees
            assert order_stages({"queue", "forward"}) == ["forward", "queue"]
        assert order_stages({"queue", "forward"}) == ["queue", "forward"]
    with pipeline_order(load_stage_map("triton").stage_order()):
        assert order_stages({"respond", "compute_output", "forward", "compute_input", "queue",
                             "download", "resize"}) == [
            "download", "resize", "queue", "compute_input", "forward", "compute_output", "respond"]
    assert order_stages(names)[0] == "decode"  # restored


def test_text_report_lists_the_map_stages_in_the_map_order(tmp_path: Path, capsys):
    path = triton_queue_scenario(tmp_path / "t.jsonl")
    assert main(["report", str(path), "--stage-map", "triton"]) == 0
    text = capsys.readouterr().out
    table = text[: text.index("(unaccounted)")]
    rows = [line.split()[0] for line in table.splitlines() if line.startswith(" ") and line.split()]
    want = ["download", "queue", "compute_input", "forward", "compute_output", "respond"]
    assert [r for r in rows if r in want] == want
    # the library's own traces keep the standard order under the same map
    own = load_paths([Path(__file__).parent / "data" / "traces" / "gpu_busy.otlp.jsonl"])
    with pipeline_order(load_stage_map("triton").stage_order()):
        stages = list(diagnose(own).stages)
    assert len(stages) >= 3 and stages == [s for s in semconv.STANDARD_STAGES if s in stages]
