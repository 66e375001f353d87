"""Input cohorts: keys, the cold request against its own input, requests set apart (first of a new
input, after an idle gap), and how much of the total's variance the input mix explains."""

from __future__ import annotations

import random

import pytest

from otel_stages import semconv
from otel_stages.analysis import Recording, Span, diagnose
from otel_stages.analysis.cohorts import (
    REASON_AFTER_IDLE,
    REASON_NEW_INPUT,
    CohortKeys,
    prompt_bucket,
)
from otel_stages.analysis.requests import Request, find_requests
from otel_stages.analysis.stats import variance_explained_by_groups
from tests.test_verdict import DECODE, FORWARD, T0_NS

MS = 1_000_000
SMALL, LARGE = (1024, 768), (4032, 3024)


def recording(rows: list[tuple[tuple[int, int], float, float]], *, cold_first: bool = True,
              prompt: list[int] | None = None, fmt: list[str] | None = None) -> Recording:
    """One request per row: (image size, total ms, idle seconds before it). Decode is 10 % of the
    total, forward the rest. The first request carries request.cold_start when ``cold_first``."""
    spans: list[Span] = []
    resource = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: "p1"}
    t = T0_NS
    for i, ((w, h), total, idle_s) in enumerate(rows):
        t += int(idle_s * 1e9)
        trace, req = f"{i + 1:032x}", f"{i + 1:016x}"
        attrs = {semconv.IMAGE_WIDTH: w, semconv.IMAGE_HEIGHT: h}
        if fmt is not None:
            attrs[semconv.IMAGE_FORMAT] = fmt[i]
        req_attrs: dict = {semconv.REQUEST_SEQ: i + 1}
        if cold_first:
            req_attrs[semconv.REQUEST_COLD_START] = i == 0
        if prompt is not None:
            req_attrs[semconv.PROMPT_TOKENS] = prompt[i]
        end = t + int(total * MS)
        mid = t + int(total * MS * 0.1)
        spans += [
            Span(trace, req, None, semconv.SPAN_REQUEST, t, end, req_attrs, resource),
            Span(trace, f"{i + 1:012x}0001", req, DECODE, t, mid, attrs, resource),
            Span(trace, f"{i + 1:012x}0002", req, FORWARD, mid, end, {}, resource),
        ]
        t = end + 50 * MS
    return Recording(spans=spans)


def _jitter(seed: int = 1) -> random.Random:
    return random.Random(seed)


def mixed(n_small: int = 24, n_large: int = 26, cold_ms: float = 200.0) -> Recording:
    rng = _jitter()
    rows = [(SMALL, cold_ms, 0.0)]
    sizes = [SMALL] * n_small + [LARGE] * n_large
    rng.shuffle(sizes)
    rows += [(s, (50.0 if s == SMALL else 600.0) * rng.uniform(0.97, 1.03), 0.0) for s in sizes]
    return recording(rows)


# --- keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, bucket", [(0, "0"), (1, "1"), (2, "2-3"), (20, "16-31"),
                                            (31, "16-31"), (32, "32-63")])
def test_prompt_bucket(tokens, bucket):
    assert prompt_bucket(tokens) == bucket


def test_keys_add_format_and_prompt_only_when_they_vary():
    rows = [(SMALL, 50.0, 0.0)] * 3
    plain = find_requests(recording(rows, fmt=["JPEG"] * 3).spans)
    assert {CohortKeys(plain).key(r) for r in plain} == {"1024x768"}
    formats = find_requests(recording(rows, fmt=["JPEG", "PNG", "JPEG"]).spans)
    assert [CohortKeys(formats).key(r) for r in formats] == ["1024x768 JPEG", "1024x768 PNG",
                                                               "1024x768 JPEG"]
    prompts = find_requests(recording(rows, prompt=[20, 40, 20]).spans)
    keys = CohortKeys(prompts)
    assert keys.key(prompts[1]) == "1024x768, prompt 32-63 tokens"
    unknown = Request("t", "s", T0_NS, 1.0, {})
    assert CohortKeys([unknown]).key(unknown) is None


def test_an_unsized_image_among_sized_ones_is_an_unknown_input():
    """A tester's: 5 % of decode spans lost their attributes, every request had a prompt length:
    "prompt 32-63 tokens" became an input of its own, its first request set apart as a new input
    with "warm up each input shape"."""
    rows = [(SMALL, 50.0, 0.0)] * 4
    rec = recording(rows, prompt=[40] * 4)
    for span in rec.spans:  # the third request's decode span lost its attributes
        if span.name == DECODE and span.trace_id == f"{3:032x}":
            span.attributes.clear()
    reqs = find_requests(rec.spans)
    keys = CohortKeys(reqs)
    assert [keys.key(r) for r in reqs] == ["1024x768, prompt 32-63 tokens"] * 2 + [None] + [
        "1024x768, prompt 32-63 tokens"]
    # no image sized anywhere (a text model): the prompt length is the input
    for span in rec.spans:
        if span.name == DECODE:
            span.attributes.clear()
    texts = find_requests(rec.spans)
    assert CohortKeys(texts).key(texts[0]) == "prompt 32-63 tokens"


# --- the cold request against its own input --------------------------------------------------------


def test_cold_request_is_compared_with_its_own_cohort():
    report = diagnose(mixed())
    cold = report.cold_start
    assert cold is not None
    assert (cold.compared_with, cold.cohort, cold.comparable_requests) == ("same_input", "1024x768", 24)
    assert cold.ratio == pytest.approx(4.0, rel=0.05)
    assert cold.warm_median_total_ms is not None and cold.total_ms < cold.warm_median_total_ms
    assert report.to_dict()["cold_start"]["ratio"] == pytest.approx(cold.ratio, abs=0.01)


@pytest.mark.parametrize("same_input, compared_with", [  # COMPARABLE_MIN_REQUESTS 5
    (4, "all_warm"), (5, "same_input")])
def test_fewer_than_five_of_its_input_compares_with_all_warm(same_input, compared_with):
    report = diagnose(mixed(n_small=same_input))
    assert report.cold_start is not None and report.cold_start.compared_with == compared_with
    expected = (report.cold_start.warm_median_total_ms if compared_with == "all_warm"
                else pytest.approx(50.0, rel=0.05))
    assert report.cold_start.comparable_median_total_ms == expected


# --- set apart: first of a new input, after an idle gap ---------------------------------------------


def _first_large(ratio: float, *, cold_first: bool = True) -> Recording:
    """Cold small request, 10 small ones, then a large one at ``ratio`` x the later large ones."""
    rows = [(SMALL, 200.0, 0.0)] + [(SMALL, 50.0, 0.0)] * 10
    rows += [(LARGE, 600.0 * ratio, 0.0)] + [(LARGE, 600.0, 0.0)] * 8
    return recording(rows, cold_first=cold_first)


@pytest.mark.parametrize("ratio, apart", [(1.99, False), (2.01, True)])  # COLD_START_MIN_RATIO
def test_first_request_of_a_new_input_is_set_apart_when_it_stands_out(ratio, apart):
    report = diagnose(_first_large(ratio))
    assert [a.reason for a in report.set_apart] == ([REASON_NEW_INPUT] if apart else [])
    assert report.counts.warm == (18 if apart else 19)
    assert report.counts.cold == (2 if apart else 1)
    assert report.requests == report.counts.warm + report.counts.cold + report.counts.failed
    if apart:
        entry = report.to_dict()["set_apart"][0]
        assert entry["cohort"] == "4032x3024" and entry["ratio"] == pytest.approx(ratio, abs=0.01)
        assert report.stages[FORWARD].max_ms < 600  # kept out of the warm statistics


def test_no_new_input_flag_without_the_process_start():
    # the file starts mid-process (seq 1 is not in it): the first large one may not be the first
    rec = _first_large(3.0, cold_first=False)
    report = diagnose(Recording(spans=[s for s in rec.spans if s.trace_id != f"{1:032x}"]))
    assert report.cold_start is None and report.set_apart == []


@pytest.mark.parametrize("idle_s, apart", [(29.9, False), (30.1, True)])  # IDLE_GAP_MIN_S 30
def test_a_request_after_an_idle_gap_is_set_apart_when_it_stands_out(idle_s, apart):
    rows = [(SMALL, 200.0, 0.0)] + [(SMALL, 50.0, 0.0)] * 10 + [(SMALL, 150.0, idle_s)]
    rows += [(SMALL, 50.0, 0.0)] * 5
    report = diagnose(recording(rows))
    assert [a.reason for a in report.set_apart] == ([REASON_AFTER_IDLE] if apart else [])
    if apart:
        assert report.set_apart[0].idle_s == pytest.approx(idle_s + 0.05, abs=0.01)  # +50 ms spacing


def test_an_idle_request_that_does_not_stand_out_stays_warm():
    rows = [(SMALL, 200.0, 0.0)] + [(SMALL, 50.0, 0.0)] * 10 + [(SMALL, 52.0, 300.0)]
    assert diagnose(recording(rows)).set_apart == []


# --- input mix ------------------------------------------------------------------------------------


def test_input_mix_explains_the_variance_it_causes():
    report = diagnose(mixed())
    assert report.input_mix_explains is not None and report.input_mix_explains > 0.95
    assert [c.key for c in report.cohorts] == ["4032x3024", "1024x768"]  # largest first
    assert [c.requests for c in report.cohorts] == [26, 24]
    assert report.verdict.evidence[0].startswith("the input mix explains")


def test_one_input_has_no_mix_and_unknown_inputs_no_cohorts():
    one = diagnose(recording([(SMALL, 50.0 + i % 3, 0.0) for i in range(25)]))
    assert one.input_mix_explains is None and [c.key for c in one.cohorts] == ["1024x768"]
    spans = [s if s.name != DECODE else Span(s.trace_id, s.span_id, s.parent_span_id, s.name,
                                             s.start_ns, s.end_ns)
             for s in recording([(SMALL, 50.0, 0.0)] * 25).spans]
    unknown = diagnose(Recording(spans=spans))
    assert unknown.cohorts == [] and unknown.to_dict()["cohorts"] == []
    assert unknown.cold_start is not None and unknown.cold_start.compared_with == "all_warm"


def test_omega_squared_does_not_reward_many_small_groups():
    rng = random.Random(3)
    noise = [rng.gauss(100, 10) for _ in range(40)]
    assert variance_explained_by_groups([noise[i:i + 2] for i in range(0, 40, 2)]) < 0.2
    assert variance_explained_by_groups([[v] for v in noise]) is None  # no within-group spread
    two = [[rng.gauss(50, 1) for _ in range(20)], [rng.gauss(600, 10) for _ in range(20)]]
    assert variance_explained_by_groups(two) > 0.99
    assert variance_explained_by_groups([noise]) is None
