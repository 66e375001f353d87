"""Stage maps on a fresh-eyes tester's Triton and vLLM traces (tests/data/server_traces, see its
README for the producers' sources): each finding as a test through the real CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from otel_stages.analysis import Recording
from otel_stages.analysis.decision import MIN_WARM_RUNS
from otel_stages.analysis.model import Span
from otel_stages.analysis.stage_map import (
    MAX_ATTRIBUTE_DURATION_S,
    StageMapError,
    apply_stage_map,
    load_stage_map,
    parse_stage_map,
)
from otel_stages.analysis.stage_map_labels import label_stats, warm_requests
from otel_stages.cli import main

DATA = Path(__file__).parent / "data" / "server_traces"


def _report(argv: list[str], capsys) -> tuple[int, dict, str]:
    code = main(["report", *argv, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else {}, out.err


def _text(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["report", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# --- 1. Triton: which composing models preprocess ---------------------------------------------------


def test_a_pre_trained_model_is_the_forward_not_preprocessing(capsys):
    """vit_pre_trained is the network: "pre" before another word is no preprocessing, and the
    forward entry is not called a map fault when nothing else runs."""
    code, out, err = _report([str(DATA / "t3_pretrained.jsonl.gz"), "--stage-map", "triton"], capsys)
    assert code == 0, err
    assert out["verdict"]["stage"] == "forward"
    assert "preprocess" not in out["stages"]
    assert out["problems"] == []


def test_a_dali_model_is_preprocessing(capsys):
    """An NVIDIA DALI model (decode/resize in an ensemble) is the preprocess stage, with the
    preprocess cause, and its swing shows on its per-model line though its median is small."""
    code, out, err = _report([str(DATA / "t5_dali.jsonl.gz"), "--stage-map", "triton"], capsys)
    assert code == 0, err
    assert out["verdict"]["stage"] == "preprocess"
    assert out["verdict"]["cause"] == "preprocess"  # a mapped preprocess stage: the standard cause
    assert out["stages"]["forward"]["swing_ms"] < 2
    dali = out["stage_map"]["labels"]["preprocess"]["dali"]
    assert dali["swing_ms"] > 30 and dali["explains"] > 0.9 and dali["median_ms"] < 7
    assert dali["requests"] == 59  # the warm requests (60 less the first)


def test_a_when_rule_that_takes_every_pair_is_no_map_fault(tmp_path: Path, capsys):
    """Every model matched the ``when`` entry: the plain entry of the same events found nothing,
    which is no fault (before: "forward ... matched nothing ... never paired")."""
    own = tmp_path / "own.yaml"
    own.write_text(
        "name: own\nrequest: InferRequest\nlabel: triton.model_name\nstages:\n"
        "  - {stage: vit, from_event: COMPUTE_INPUT_END, to_event: COMPUTE_OUTPUT_START,"
        " when: vit}\n"
        "  - {stage: forward, from_event: COMPUTE_INPUT_END, to_event: COMPUTE_OUTPUT_START}\n")
    code, out, err = _report([str(DATA / "t3_pretrained.jsonl.gz"), "--stage-map", str(own)],
                             capsys)
    assert code == 0, err
    assert list(out["stages"]) == ["vit"]
    assert out["problems"] == []


# --- 2. per-model swing and part of the variance ------------------------------------------------------


def test_the_swinging_model_of_a_stage_leads_its_lines(capsys):
    """t7: image_encoder (median 15 ms) swings, fusion_llm (median 30 ms) does not; both are
    forward. The per-model lines put image_encoder first, with its swing and its part of the
    total's variance; JSON alike."""
    path = str(DATA / "t7_parallel.jsonl.gz")
    code, out, err = _report([path, "--stage-map", "triton"], capsys)
    assert code == 0, err
    forward = out["stage_map"]["labels"]["forward"]
    assert list(forward) == ["image_encoder", "fusion_llm"]  # by part of the variance
    assert forward["image_encoder"]["median_ms"] < forward["fusion_llm"]["median_ms"]
    assert forward["image_encoder"]["explains"] > 0.9 > 0.1 > forward["fusion_llm"]["explains"]
    assert forward["image_encoder"]["swing_ms"] > 30 > 2 > forward["fusion_llm"]["swing_ms"]
    code, text, err = _text([path, "--stage-map", "triton"], capsys)
    block = text[text.index("Stage map triton, time per triton.model_name"):]
    lines = block.splitlines()
    at = lines.index("  forward:")
    assert lines[at + 1].startswith("    image_encoder ") and ", explains 100%" in lines[at + 1]
    assert lines[at + 2].startswith("    fusion_llm ")


def test_part_of_the_variance_needs_enough_warm_requests():
    """Below MIN_WARM_RUNS warm requests a covariance is noise: no ``explains``; at it, one."""
    from otel_stages.analysis import load_paths

    recording, _ = apply_stage_map(load_stage_map("triton"),
                                   load_paths([str(DATA / "t7_parallel.jsonl.gz")]))
    warm = warm_requests(recording)
    few = label_stats(warm[:MIN_WARM_RUNS - 1], "triton.model_name")
    enough = label_stats(warm[:MIN_WARM_RUNS], "triton.model_name")
    assert few["forward"]["image_encoder"].explains is None
    assert enough["forward"]["image_encoder"].explains is not None


# --- 3. vLLM: the API server's time outside the engine ------------------------------------------------


def test_vllm_output_tail_is_the_api_server_stage_with_both_halves_named(capsys):
    """v1e: the front end's output path after the last token swings. The rest of e2e is named
    for what it is (api_server: input processing and the output path) and the advice says both
    halves, with things a vLLM user can do, never stage() spans."""
    code, out, err = _report([str(DATA / "v1e_tail.jsonl.gz"), "--stage-map", "vllm"], capsys)
    assert code == 0, err
    assert list(out["stages"]) == ["api_server", "queue", "forward"]
    verdict = out["verdict"]
    assert verdict["stage"] == "api_server"
    assert not any("stage()" in a for a in verdict["advice"])
    first = verdict["advice"][0]
    assert "input processing" in first and "output path after the last token" in first
    assert "--api-server-count" in first


# --- 4. vLLM token counts -----------------------------------------------------------------------------


def test_vllm_prompt_tokens_make_the_same_cohorts_as_input_tokens(capsys):
    """vLLM writes gen_ai.usage.prompt_tokens; the control file also has input_tokens. Both give
    the same input cohorts (before: none for vLLM's own name)."""
    cohorts = []
    for name in ("v1d_prompt_short", "v1d_prompt_short_control"):
        code, out, err = _report([str(DATA / f"{name}.jsonl.gz"), "--stage-map", "vllm"], capsys)
        assert code == 0, err
        cohorts.append(out["cohorts"])
    assert cohorts[0] == cohorts[1]
    assert any("prompt 4096-8191 tokens" in c["key"] for c in cohorts[0])


def test_a_first_request_with_a_longer_output_is_not_called_a_cold_start(capsys):
    """v1b: the first request generated 512 tokens, the others 8..512; its time is its output
    length, not a cold start (before: "7.9x the median of all 79 warm requests ... and a cold
    start too"). Output length is part of the cohort key, so it is compared with the requests
    that generated as many tokens."""
    code, out, err = _report([str(DATA / "v1b_completion.jsonl.gz"), "--stage-map", "vllm"], capsys)
    assert code == 0, err
    keys = [c["key"] for c in out["cohorts"]]
    assert "prompt 256-511 tokens, output 512-1023 tokens" in keys
    cold = [e for e in out["verdict"]["evidence"] if e.startswith("first request")]
    assert len(cold) == 1 and "cold start too" not in cold[0]
    assert ("1.0x the median of the 11 warm requests with the same input (prompt 256-511 tokens,"
            " output 512-1023 tokens") in cold[0]
    assert not any("warm the model up" in a for a in out["verdict"]["advice"])


@pytest.mark.parametrize("compared_with, input_known, claim", [
    ("same_input", True, "cold start too"), ("all_warm", False, "cold start too"),
    ("all_warm", True, "not comparable"),
])
def test_a_slow_first_request_of_another_input_is_not_comparable(compared_with: str,
                                                                 input_known: bool, claim: str):
    """A first request 8x the median of requests whose input differs from its own (fewer than
    COMPARABLE_MIN_REQUESTS share it) is not called a cold start; with the same input, or an
    unknown one (nothing to tell them apart), it is."""
    from otel_stages.analysis.decision import _cold_line
    from otel_stages.analysis.figures import ALL_WARM, SAME_INPUT, ColdFigures
    from otel_stages.analysis.verdict import Verdict

    cold = ColdFigures(count=1, total_ms=800.0, stages_ms={"forward": 800.0},
                       comparable_median_total_ms=100.0, comparable_stages_ms={"forward": 100.0},
                       compared_with={"same_input": SAME_INPUT, "all_warm": ALL_WARM}[compared_with],
                       comparable_requests=20, cohort="prompt 256-511 tokens",
                       input_known=input_known)
    verdict = Verdict("forward", "forward")
    _cold_line(verdict, cold)
    assert claim in verdict.evidence[-1]
    assert any("warm the model up" in a for a in verdict.advice) == (claim == "cold start too")


# --- 5. vLLM: non-finite or absurd latency attributes -------------------------------------------------


@pytest.mark.parametrize("name, says", [
    ("vllm_nan", "gen_ai.latency.time_in_model_prefill is not a finite number (nan)"),
    ("vllm_inf", "gen_ai.latency.time_in_model_decode is not a finite number (inf)"),
    ("vllm_huge", "gen_ai.latency.time_in_model_decode is not a plausible duration (1e+300 s"),
])
def test_a_non_finite_latency_leaves_that_span_out_counted(name: str, says: str, capsys):
    """One bad value: that request is left out with a counted problem (not mapped by the V0
    variant either), the other 79 are reported; no traceback."""
    code, out, err = _report([str(DATA / f"{name}.jsonl.gz"), "--stage-map", "vllm"], capsys)
    assert code == 0, err
    assert out["requests"] == 79
    assert out["stage_map"]["requests_unmapped"] == 1
    assert out["problems"] == [
        f"stage map vllm: 1 of 80 request span(s) left out of the timings: {says}"
        + out["problems"][0].split(says, 1)[1]]


def _v1_span(decode: object) -> Span:
    attrs: dict[str, object] = {
        "gen_ai.latency.time_in_queue": 0.001, "gen_ai.latency.time_in_model_prefill": 0.01,
        "gen_ai.latency.time_in_model_decode": decode, "gen_ai.latency.time_to_first_token": 0.02,
        "gen_ai.latency.e2e": 0.5}
    return Span(trace_id="a" * 32, span_id="b" * 16, parent_span_id=None, name="llm_request",
                start_ns=0, end_ns=10**9, attributes=attrs)  # type: ignore[arg-type]


@pytest.mark.parametrize("decode, mapped", [
    (MAX_ATTRIBUTE_DURATION_S * 0.999, True), (MAX_ATTRIBUTE_DURATION_S * 1.001, False),
    (math.nan, False), (-math.inf, False), (10**400, False), (10**20, False), (0.4, True),
])
def test_attribute_durations_beyond_a_day_or_not_finite_are_refused(decode: object, mapped: bool):
    _, summary = apply_stage_map(load_stage_map("vllm"), Recording(spans=[_v1_span(decode)]))
    assert (summary.mapped, summary.unmapped) == ((1, 0) if mapped else (0, 1))


# --- 6. HTML: the real reason a verdict is tentative --------------------------------------------------


def test_html_says_why_the_verdict_is_tentative(tmp_path: Path, capsys):
    """t2_bls has 59 warm requests; its verdict is tentative because mapped stages overlap. The
    HTML says that (the text report's evidence line), not "fewer than 20 warm requests"."""
    pytest.importorskip("bokeh")
    html = tmp_path / "bls.html"
    code = main(["report", str(DATA / "t2_bls.jsonl.gz"), "--stage-map", "triton",
                 "--html", str(html)])
    capsys.readouterr()
    assert code == 0
    page = html.read_text(encoding="utf-8")
    start = page.index("<span class='tentative'>")
    badge = page[start:page.index("</span>", start)]
    assert "fewer than 20 warm requests" not in page
    assert "tentative: stages overlap in" in badge and "this verdict is tentative" in badge


# --- 7. advice a server's user can follow ---------------------------------------------------------------


def test_mapped_stage_advice_never_says_stage_spans(tmp_path: Path, capsys):
    """A custom map's custom stage (cause other) gets advice on the server's own telemetry, not
    "time its sub-steps with nested stage() spans"; a built-in map's stage gets its entry's
    advice first (Triton: the model's own metrics and instance_group)."""
    own = tmp_path / "own.yaml"
    own.write_text(
        "name: own\nrequest: InferRequest\nstages:\n"
        "  - {stage: vit_block, from_event: COMPUTE_INPUT_END, to_event: COMPUTE_OUTPUT_START}\n")
    code, out, err = _report([str(DATA / "t3_pretrained.jsonl.gz"), "--stage-map", str(own)],
                             capsys)
    assert code == 0, err
    verdict = out["verdict"]
    assert (verdict["cause"], verdict["stage"]) == ("other", "vit_block")
    assert not any("stage()" in a for a in verdict["advice"])
    assert verdict["advice"][0].startswith("vit_block is timed from the server's own telemetry"
                                           " by stage map own (events COMPUTE_INPUT_END ->")
    code, out, err = _report([str(DATA / "t5_dali.jsonl.gz"), "--stage-map", "triton"], capsys)
    advice = out["verdict"]["advice"]
    assert "instance_group" in advice[0]
    # the preprocess cause's in-process lines (Pillow draft decoding through otel_stages.imaging,
    # attributes on a decode span) are no help for a Triton model
    assert not any(m in a for a in advice for m in ("otel_stages.", "imaging.decode", "decode span"))
    code, out, err = _report([str(DATA / "mixed" / "v1c_queue.jsonl.gz"), "--stage-map", "vllm"],
                             capsys)
    advice = out["verdict"]["advice"]
    assert out["verdict"]["stage"] == "queue" and "--max-num-seqs" in advice[0]
    assert not any("queue.depth" in a for a in advice)


# --- 8. reserved names, unmatched spans -----------------------------------------------------------------


@pytest.mark.parametrize("text, entry, name", [
    # the tester's maps/unacc.yaml and maps/total.json
    ('name: x\nrequest: POST /v1/caption\nstages:\n  - {stage: "(unaccounted)", span: pipeline}\n'
     "  - {stage: download, span: fetch_image}\n", "stages[0]", "(unaccounted)"),
    ('{"name": "x", "request": "POST /v1/caption", "stages": [{"stage": "total", "span":'
     ' "model_infer"}]}', "stages[0]", "total"),
    ('name: x\nrequest: r\nstages:\n  - {stage: download, span: a}\n'
     '  - {stage: "(overlap)", span: b}\n', "stages[1]", "(overlap)"),
    ("name: x\nrequest: r\nstages:\n  - {stage: unaccounted, span: b}\n", "stages[0]",
     "unaccounted"),
])
def test_reserved_stage_names_are_refused_naming_the_entry(text: str, entry: str, name: str,
                                                           tmp_path: Path, capsys):
    with pytest.raises(StageMapError, match=re.escape(f"m: {entry}: a stage cannot be named '{name}'")):
        parse_stage_map(text, where="m")
    path = tmp_path / "map.yaml"
    path.write_text(text)
    code = main(["report", str(DATA / "t3_pretrained.jsonl.gz"), "--stage-map", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and f"{entry}: a stage cannot be named '{name}'" in err
    assert "Traceback" not in err


def test_a_mixed_folder_says_what_the_map_did_not_match(capsys):
    """Triton, vLLM and a custom service's files in one folder, --stage-map triton: the spans the
    map did not take are counted by service, with the map that fits some of them."""
    code, out, err = _report([str(DATA / "mixed"), "--stage-map", "triton"], capsys)
    assert code == 0, err
    assert out["requests"] == 60
    assert out["problems"] == [
        "stage map triton: 500 spans in traces without a request span of the map, from 2 services"
        " (caption-svc: 420, unknown_service: 80), were not mapped: they count only where they are"
        " otel-stages' own request spans; is another server's data in the same files? Some match"
        " --stage-map vllm: report them apart with it."]
