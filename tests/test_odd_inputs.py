"""A fresh-eyes tester's odd inputs (tests/odd_inputs.py regenerates each file byte for byte):
untraced time as the largest share, stage spans on a skewed clock, conflicting span ids, mostly
failed runs, ``explains`` outside 0..1, stages missing from requests, requests set apart after an
idle gap, cold-start wording, a failed first request. Each rule is pinned just below and above its
threshold on hand-built figures, and each file goes through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_stages.analysis import advice
from otel_stages.analysis.decision import decide, untraced_is_largest
from otel_stages.analysis.figures import UnaccountedFigures
from otel_stages.cli import main
from tests import odd_inputs
from tests.test_decision import figures, stage


def report_of(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["report", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def text_of(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", str(path)]) == 0
    return capsys.readouterr().out


# --- 1. untraced time as the largest share; stage spans on another host's clock ----------------


@pytest.mark.parametrize("gap_share, untraced", [(0.74, False), (0.76, True)])
def test_untraced_time_as_the_largest_share_is_where_to_start(gap_share, untraced):
    # forward is 75 % of the request (test_decision.MEDIANS): the largest share just below / above
    fig = figures(total_swing=2.0, unaccounted=UnaccountedFigures(gap_share * 100, 0.5, gap_share, 0.0))
    assert untraced_is_largest(fig) is untraced
    v = decide(fig)
    assert v.cause == "stable"
    text = " ".join(v.evidence + v.advice)
    if untraced:
        assert "outside the stage spans" in text and f"{round(gap_share * 100)}% is untraced" in text
        assert "start with forward" not in text and advice.UNTRACED_SHARE in v.advice[-1]
    else:
        assert "largest share: forward" in text and "start with forward" in text
        assert "untraced" not in text


def test_untraced_largest_share_is_added_to_a_stage_verdict():
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0,
                  unaccounted=UnaccountedFigures(80.0, 0.5, 0.8, 0.0))
    v = decide(fig)
    assert v.stage == "forward"
    assert any("most request time lies outside the stage spans" in e for e in v.evidence)
    assert v.advice[-1] == "also: " + advice.UNTRACED_SHARE


@pytest.mark.parametrize("detached, skew", [(14, False), (15, True)])
def test_untraced_time_is_read_as_clock_skew_from_half_the_requests(detached, skew):
    """SKEWED_MIN_FRACTION 0.5 (literal) of 30 requests: 14 with a stage span wholly outside its
    request is missing instrumentation, 15 is clock skew; evidence and advice follow."""
    gap = UnaccountedFigures(80.0, 0.5, 0.8, 0.0)
    for fig in (figures(total_swing=2.0, unaccounted=gap, requests=30, detached_requests=detached),
                figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, unaccounted=gap,
                        requests=30, detached_requests=detached)):
        v = decide(fig)
        text = " ".join(v.evidence)
        assert (f"in {detached} of 30 requests a stage span lies wholly outside" in text) is skew
        assert ("80% is untraced" in text) is not skew
        assert any(advice.SYNC_CLOCKS in a for a in v.advice) is skew
        assert any(advice.UNTRACED_SHARE in a for a in v.advice) is not skew


@pytest.mark.parametrize("detached, skew", [(14, False), (15, True)])
def test_a_swinging_untraced_time_from_skew_asks_to_sync_the_clocks(detached, skew):
    fig = figures(stage("forward", 2.0, explains=0.0), total_swing=40.0, requests=30,
                  detached_requests=detached, unaccounted=UnaccountedFigures(80.0, 40.0, 0.8, 0.95))
    v = decide(fig)
    assert v.cause is None and v.stage is None
    assert v.advice == [advice.SYNC_CLOCKS if skew else advice.UNTRACED]


def test_clock_skewed_stage_spans_are_named_and_never_the_place_to_start(tmp_path, capsys):
    out = report_of(odd_inputs.clock_skew(tmp_path / "skew.jsonl"), capsys)
    assert out["stages"]["forward"]["median_ms"] == 0.0
    assert out["unaccounted"]["share"] > 0.8
    (skew,) = [p for p in out["problems"] if "entirely outside their request span" in p]
    assert skew.startswith("30 stage spans in 30 requests") and "clock skew between hosts" in skew
    assert "starts 1898.5 ms after the request ended" in skew
    assert not any("reach outside" in p for p in out["problems"])  # not counted twice
    verdict = out["verdict"]
    assert verdict["cause"] == "stable"
    assert any("(82%, median" in e and "30 of 30 requests a stage span lies wholly outside" in e
               and "not untraced work" in e for e in verdict["evidence"])
    assert not any("is untraced" in e for e in verdict["evidence"])
    assert any("sync the clocks" in a for a in verdict["advice"])
    assert not any("wrap that work" in a or "start with the untraced" in a for a in verdict["advice"])
    assert not any("start with decode" in a for a in verdict["advice"])
    assert not any("largest share: decode" in e for e in verdict["evidence"])


def test_a_stage_ending_before_its_request_began_is_named_too(tmp_path, capsys):
    path = odd_inputs.write(tmp_path / "back.jsonl",
                            odd_inputs.shift(odd_inputs.run(30), "forward", -1_000_000_000))
    out = report_of(path, capsys)
    assert any("entirely outside" in p and "before the request began" in p for p in out["problems"])


def test_a_stage_sticking_out_is_not_called_clock_skew(tmp_path, capsys):
    # forward moved by 50 ms: still partly inside its request
    path = odd_inputs.write(tmp_path / "part.jsonl",
                            odd_inputs.shift(odd_inputs.run(30), "forward", 50_000_000))
    out = report_of(path, capsys)
    assert any("reach outside their request span in 30 requests" in p for p in out["problems"])
    assert not any("entirely outside" in p for p in out["problems"])


def test_zero_length_stages_point_at_the_untraced_time(tmp_path, capsys):
    out = report_of(odd_inputs.zero_dur(tmp_path / "zero.jsonl"), capsys)
    verdict = out["verdict"]
    assert any("100% is untraced" in e for e in verdict["evidence"])
    assert not any("start with download" in a for a in verdict["advice"])
    assert not any("entirely outside" in p for p in out["problems"])  # 0 ms spans are inside


# --- 2. span ids shared by different spans --------------------------------------------------------


def test_conflicting_span_ids_are_named(tmp_path, capsys):
    out = report_of(odd_inputs.dup_ids_one_trace(tmp_path / "dup.jsonl"), capsys)
    assert out["requests"] == 1
    (clash,) = [p for p in out["problems"] if "share a span id with a different span" in p]
    assert clash.startswith("29 spans share") and "'request' and 'request' starting 224.0 ms apart" in clash
    # the merged request's stages are not blamed on a clock
    assert not any("entirely outside" in p or "reach outside" in p for p in out["problems"])


def test_exact_duplicate_lines_stay_deduplicated_without_a_problem(tmp_path, capsys):
    out = report_of(odd_inputs.dup_lines(tmp_path / "twice.jsonl"), capsys)
    assert out["requests"] == 30 and out["counts"]["warm"] == 29
    assert out["problems"] == []


@pytest.mark.parametrize("change, clash", [
    ({}, False),
    ({"end_ns": 1}, True),
    ({"start_ns": 1, "end_ns": 1}, True),
    ({"parent_span_id": "f" * 16}, True),
    ({"name": "decode"}, True),
])
def test_a_span_id_clash_is_any_difference_in_name_parent_or_times(change, clash):
    from msgspec.structs import replace

    from otel_stages.analysis import Span
    from otel_stages.analysis.requests import group_spans
    from tests.test_verdict import T0_NS

    req = Span("a" * 32, "1" * 16, None, "request", T0_NS, T0_NS + 100_000_000)
    fwd = Span("a" * 32, "2" * 16, "1" * 16, "forward", T0_NS + 10, T0_NS + 90_000_000)
    moved = {k: (getattr(fwd, k) + v if isinstance(v, int) else v) for k, v in change.items()}
    grouping = group_spans([req, fwd, replace(fwd, **moved)])
    assert len(grouping.requests) == 1
    assert any("share" in p and "a span id with a different span" in p
               for p in grouping.problems) is clash


# --- 3. most requests failed -----------------------------------------------------------------------


@pytest.mark.parametrize("failed, first", [(24, False), (25, True)])  # of 100: FAILED_MIN_FRACTION 0.25
def test_failures_come_first_from_a_quarter_of_the_requests(failed, first):
    fig = figures(total_swing=2.0, n=100 - failed - 1, failed_requests=failed, requests=100,
                  failure_kinds={"TimeoutError": failed})
    v = decide(fig)
    assert v.evidence[0].startswith(f"{failed}% of requests failed ({failed} of 100; TimeoutError:"
                                    f" {failed}") is first
    assert (v.advice[0] == advice.FIX_FAILURES) is first
    assert v.tentative is first  # 74-75 warm requests: only the failures make it tentative
    if not first:
        assert any(f"{failed} of 100 requests ended with an error" in e for e in v.evidence)


def test_failures_first_replace_the_advice_to_send_more(tmp_path, capsys):
    out = report_of(odd_inputs.mostly_failed(tmp_path / "failed.jsonl"), capsys)
    assert out["counts"] == {"warm": 4, "cold": 1, "failed": 25, "incomplete": 0}
    verdict = out["verdict"]
    assert verdict["evidence"][0].startswith("83% of requests failed (25 of 30; error type not"
                                             " recorded: 25; last stage forward: 25)")
    assert verdict["advice"] == [advice.FIX_FAILURES]
    assert not any("send the same input" in a for a in verdict["advice"])
    assert not any("more time" in e for e in verdict["evidence"])


def test_failure_kinds_come_from_error_type_and_exception_events():
    from otel_stages.analysis import Span
    from otel_stages.analysis.diagnosis import failure_kinds
    from otel_stages.analysis.model import SpanEvent
    from otel_stages.analysis.requests import group_spans
    from tests.test_verdict import T0_NS

    spans = []
    for i, (attrs, events) in enumerate([
        ({"error.type": "OOM"}, ()),
        ({}, (SpanEvent("exception", T0_NS, {"exception.type": "ValueError"}),)),
        ({}, ()),
    ]):
        trace, req = f"{i:032x}", f"{i + 1:016x}"
        t = T0_NS + i * 10**9
        spans += [Span(trace, req, None, "request", t, t + 10**8, attrs, error=True),
                  Span(trace, f"{i + 9:016x}", req, "decode", t, t + 10**7, {}, error=bool(events),
                       events=events)]
    kinds, where = failure_kinds(group_spans(spans).requests)
    assert kinds == {"OOM": 1, "ValueError": 1, "error type not recorded": 1}
    assert where == {"failed in decode": 1, "last stage decode": 2}


# --- 4. explains: not below the minimum warm count, offsetting stages said ------------------------


@pytest.mark.parametrize("n, shown", [(5, False), (6, True)])  # n - 1 warm: MIN_WARM_RUNS 5
def test_explains_is_not_shown_below_the_minimum_warm_count(tmp_path, capsys, n, shown):
    path = odd_inputs.write(tmp_path / f"n{n}.jsonl", odd_inputs.run(n))
    out = report_of(path, capsys)
    assert out["counts"]["warm"] == n - 1
    assert all((s["explains"] is not None) is shown for s in out["stages"].values())
    assert (out["unaccounted"]["explains"] is not None) is shown
    text = text_of(path, capsys)
    assert ("explains - = fewer than 5 warm requests" in text) is not shown


def test_three_requests_no_longer_explain_thousands_of_percent(tmp_path, capsys):
    text = text_of(odd_inputs.write(tmp_path / "n3.jsonl", odd_inputs.run(3)), capsys)
    assert "%" not in text.split("Warm-run stages")[1].split("(unaccounted) =")[0].replace(
        "share", "").split("forward")[0].split("download")[1].split()[-1]  # the explains cell
    assert "-1742%" not in text and "1924%" not in text


@pytest.mark.parametrize("explains, said", [(-0.09, False), (-0.11, True), (1.09, False), (1.11, True)])
def test_offsetting_stages_are_explained_from_ten_points_outside(explains, said):
    fig = figures(stage("decode", 0.5, explains=explains), total_swing=2.0)
    lines = [e for e in decide(fig).evidence if e.startswith("explains outside 0-100%")]
    assert bool(lines) is said
    if said:
        assert "offset each other" in lines[0] and f"decode {round(explains * 100)}%" in lines[0]


def test_anti_correlated_stages_are_said_to_offset_each_other(tmp_path, capsys):
    path = odd_inputs.anti_corr(tmp_path / "anti.jsonl")
    out = report_of(path, capsys)
    # the JSON keeps the decomposition (it adds up to 1), the evidence says why it leaves 0..1
    assert out["stages"]["decode"]["explains"] < -1 < 1 < out["stages"]["forward"]["explains"]
    assert sum(s["explains"] for s in out["stages"].values()) + out["unaccounted"]["explains"] \
        == pytest.approx(1.0, abs=1e-3)
    (line,) = [e for e in out["verdict"]["evidence"] if e.startswith("explains outside 0-100%")]
    assert "decode -129%, forward 129%" in line and "offset each other" in line
    assert "explains below 0% or above 100%: stages that offset each other" in text_of(path, capsys)


# --- 5. a stage missing from many requests ----------------------------------------------------------


@pytest.mark.parametrize("count, named", [(27, False), (26, True)])  # of 30: STAGE_PRESENT_MIN_FRACTION 0.9
def test_a_stage_missing_from_warm_requests_is_named_below_nine_tenths(count, named):
    partial = stage("download", 0.2)
    partial = type(partial)(**{**partial.__dict__, "count": count})
    fig = figures(partial, total_swing=2.0, per_request=True)
    lines = [e for e in decide(fig).evidence if "appears in only" in e]
    assert bool(lines) is named
    if named:
        assert lines[0].startswith(f"download appears in only {count} of 30 warm requests")


def test_histogram_counts_are_not_taken_for_missing_stages():
    partial = stage("download", 0.2)
    partial = type(partial)(**{**partial.__dict__, "count": 3})
    assert not any("appears in only" in e for e in decide(figures(partial, total_swing=2.0)).evidence)


def test_missing_stage_file_names_the_stage_and_marks_its_row(tmp_path, capsys):
    path = odd_inputs.missing_stages(tmp_path / "missing.jsonl")
    out = report_of(path, capsys)
    assert out["stages"]["download"]["count"] == 14 and out["counts"]["warm"] == 29
    assert any(e.startswith("download appears in only 14 of 29 warm requests: its min / median / p95"
                            " are over those 14") for e in out["verdict"]["evidence"])
    text = " ".join(text_of(path, capsys).split())
    assert " download* 5.1 " in text and "(download in 14 of 29)" in text


# --- 6. a request set apart after an idle gap is in the verdict's evidence --------------------------


def test_a_request_set_apart_after_idle_is_in_the_evidence(tmp_path, capsys):
    out = report_of(odd_inputs.idle_gap(tmp_path / "idle.jsonl"), capsys)
    (apart,) = out["set_apart"]
    assert (apart["seq"], apart["reason"]) == (21, "after_idle")
    evidence = out["verdict"]["evidence"]
    (line,) = [e for e in evidence if e.startswith("seq 21 took")]
    assert "3.4x the median of comparable warm requests" in line and "after 60 s idle" in line
    assert any(e.startswith("no cold-start penalty on that request (others are set apart below)")
               for e in evidence)
    assert any("after an idle gap was cold again" in a for a in out["verdict"]["advice"])


def test_every_set_apart_reason_has_advice():
    from otel_stages.analysis import figures as fig_module

    reasons = {v for k, v in vars(fig_module).items() if k.startswith("REASON_")}
    assert reasons == set(advice.WARM_UP_AGAIN)


# --- 7. cold-start wording ------------------------------------------------------------------------------


def test_a_cold_request_of_unknown_input_says_so(tmp_path, capsys):
    path = odd_inputs.write(tmp_path / "n10.jsonl", odd_inputs.run(10))
    out = report_of(path, capsys)
    text = " ".join(out["verdict"]["evidence"]) + text_of(path, capsys)
    assert "its input is unknown" in text and "share its input" not in text


def test_a_request_marked_cold_later_in_its_process_is_not_called_the_first(tmp_path, capsys):
    path = odd_inputs.cold_attr_conflict(tmp_path / "conflict.jsonl")
    out = report_of(path, capsys)
    text = " ".join(" ".join(out["verdict"]["evidence"] + [text_of(path, capsys)]).split())  # unwrapped
    assert "first request of the process" not in text.lower()
    assert "the request marked cold by request.cold_start or request.seq 1 (not the first of its process)" in text
    assert "Request marked cold by request.cold_start or request.seq 1, not the first of its process" in text


# --- 8. the first request failed, the next paid the cold start --------------------------------------


def test_the_request_after_a_failed_first_one_is_set_apart(tmp_path, capsys):
    out = report_of(odd_inputs.cold_failed_first(tmp_path / "cff.jsonl"), capsys)
    (apart,) = out["set_apart"]
    assert (apart["seq"], apart["reason"]) == (2, "after_failed_start")
    assert out["counts"] == {"warm": 28, "cold": 1, "failed": 1, "incomplete": 0}
    verdict = out["verdict"]
    # seq 1 failed (OOM) after its 2 s forward: it paid the cold start, and the figures are its
    # (cohorts.failed_cold_paid), not seq 2's (set apart; the verdict does not rest on it)
    assert (verdict["cause"], verdict["stage"]) == ("cold_start", "forward")
    assert out["cold_start"]["failed"] == 1 and out["cold_start"]["count"] == 1
    assert verdict["evidence"][0].startswith("first request of the process ended with an error after")
    assert any("right after the process's first request failed: the cold start may have moved to"
               " it" in e for e in verdict["evidence"])
    assert out["stages"]["forward"]["max_ms"] < 200


def test_an_ordinary_request_after_a_failed_first_one_stays_warm(tmp_path, capsys):
    rows = odd_inputs.run(30)
    rows[0][0]["status"] = {"code": 2, "message": "OOM"}
    out = report_of(odd_inputs.write(tmp_path / "ok.jsonl", rows), capsys)
    assert out["set_apart"] == [] and out["counts"]["warm"] == 29


def test_failure_kinds_read_from_exception_events_in_an_otlp_file(tmp_path, capsys):
    # an exception event as the OTel SDK's Span.record_exception writes it (event "exception" with
    # exception.type), on each failed request span
    path = odd_inputs.mostly_failed(tmp_path / "failed.jsonl")
    lines = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            if span["status"].get("code") == 2:
                span["events"] = [{"timeUnixNano": span["endTimeUnixNano"], "name": "exception",
                                   "attributes": [{"key": "exception.type", "value": {
                                       "stringValue": "torch.OutOfMemoryError"}}]}]
        lines.append(json.dumps(doc))
    path.write_text("\n".join(lines) + "\n")
    out = report_of(path, capsys)
    assert out["verdict"]["evidence"][0].startswith(
        "83% of requests failed (25 of 30; torch.OutOfMemoryError: 25;")
