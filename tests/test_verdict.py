"""Diagnosis rules (DESIGN.md section 1) on synthetic request sets built in code."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

import pytest

from otel_stages import semconv
from otel_stages.analysis import MetricPoint, Recording, Span, diagnose
from otel_stages.analysis.gpu import MIN_GPU_SAMPLES
from otel_stages.analysis.requests import find_requests, group_spans

DOWNLOAD, DECODE, RESIZE, QUEUE, FORWARD = semconv.STANDARD_STAGES
T0_NS = 1_790_000_000_000_000_000


def build(
    rows: Sequence[dict[str, float]],
    *,
    instance: str = "proc-1",
    start_ns: int = T0_NS,
    images: Sequence[tuple[int, int, int]] | None = None,
    forward_attrs: Callable[[int], dict] | None = None,
) -> Recording:
    """One request per row (stage -> ms, in row order, back to back), 50 ms apart.

    ``images[i]`` = (width, height, bytes) put on the decode span of request ``i``.
    """
    resource = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: instance}
    spans: list[Span] = []
    t = start_ns
    tag = abs(hash(instance)) % 0xFFFF
    for i, row in enumerate(rows):
        trace_id = f"{tag:04x}{i + 1:028x}"
        request_id = f"{tag:04x}{i + 1:012x}"
        cursor = t
        for j, (name, ms) in enumerate(row.items()):
            end = cursor + int(ms * 1e6)
            attrs: dict = {}
            if name == DECODE and images is not None:
                w, h, b = images[i]
                attrs = {semconv.IMAGE_WIDTH: w, semconv.IMAGE_HEIGHT: h, semconv.IMAGE_SIZE: b}
            if name == FORWARD and forward_attrs is not None:
                attrs = forward_attrs(i)
            spans.append(
                Span(trace_id, f"{tag:04x}{i + 1:08x}{j + 1:04x}", request_id, name, cursor, end,
                     attrs, resource)
            )
            cursor = end
        spans.append(Span(trace_id, request_id, None, semconv.SPAN_REQUEST, t, cursor, {}, resource))
        t = cursor + 50_000_000
    return Recording(spans=spans)


def gpu_points(
    telemetry: Recording, value_in_forward: float, *, every_ms: float = 20.0
) -> list[MetricPoint]:
    """hw.gpu.utilization samples every ``every_ms`` over the whole run: ``value_in_forward``
    inside forward spans, 0.02 outside."""
    forwards = sorted((s.start_ns, s.end_ns) for s in telemetry.spans if s.name == FORWARD)
    start = min(s.start_ns for s in telemetry.spans)
    end = max(s.end_ns for s in telemetry.spans)
    points = []
    t = start
    while t <= end:
        inside = any(a <= t <= b for a, b in forwards)
        points.append(
            MetricPoint(semconv.HW_GPU_UTILIZATION, t, value_in_forward if inside else 0.02,
                        {semconv.HW_ID: "GPU-0"})
        )
        t += int(every_ms * 1e6)
    return points


def steady(n: int = 30, seed: int = 1, **overrides: Callable[[int, random.Random], float]):
    """Rows of a steady pipeline with +-2 % jitter; ``overrides[stage](i, rng)`` replaces a stage."""
    rng = random.Random(seed)
    base = {DOWNLOAD: 3.0, DECODE: 8.0, RESIZE: 3.0, QUEUE: 1.0, FORWARD: 100.0}
    rows = []
    for i in range(n):
        row = {k: v * rng.uniform(0.98, 1.02) for k, v in base.items()}
        for stage, fn in overrides.items():
            row[stage] = fn(i, rng)
        rows.append(row)
    return rows


def test_swings_both_ways_count_the_same():
    usually_slow = build(steady(decode=lambda i, r: 10.0 if i % 5 == 1 else 200.0))
    usually_fast = build(steady(decode=lambda i, r: 200.0 if i % 5 == 1 else 10.0))
    slow_report, fast_report = diagnose(usually_slow), diagnose(usually_fast)
    for report in (slow_report, fast_report):
        assert (report.verdict.cause, report.verdict.stage) == ("preprocess", DECODE)
    assert slow_report.stages[DECODE].swing_ms == pytest.approx(190.0, abs=1.0)
    assert fast_report.stages[DECODE].swing_ms == pytest.approx(190.0, abs=1.0)


def test_tiny_stage_with_huge_relative_swing_is_not_blamed():
    rows = steady(
        resize=lambda i, r: 6.0 if i % 2 else 0.3,  # 20x relative swing, a few ms absolute
        forward=lambda i, r: 100.0 + 60.0 * (i % 3),
    )
    report = diagnose(build(rows))
    assert report.verdict.stage == FORWARD
    assert any("resize varies" in e and "too small" in e for e in report.verdict.evidence)


def test_tiny_stage_swinging_alone_is_stable():
    report = diagnose(build(steady(resize=lambda i, r: 6.0 if i % 2 else 0.3)))
    assert report.verdict.cause == "stable"
    assert report.verdict.stage is None


@pytest.mark.parametrize("swinger, steadier", [(FORWARD, DECODE), (DECODE, FORWARD)])
def test_two_big_stages_the_one_that_swings_more_comes_first(swinger, steadier):
    rows = steady(
        **{
            swinger: lambda i, r: 150.0 + 150.0 * (i % 3 == 0),  # 150 or 300 ms
            steadier: lambda i, r: 200.0 + 30.0 * (i % 2),  # 200 or 230 ms: large but steadier
        }
    )
    report = diagnose(build(rows))
    assert report.verdict.stage == swinger
    assert report.stages[steadier].share > 0.4  # both stages are big


def test_stable_names_no_stage_but_mentions_largest_share():
    report = diagnose(build(steady()))
    assert report.verdict.cause == "stable"
    assert report.verdict.stage is None
    assert any("largest share: forward" in e for e in report.verdict.evidence)


def test_swing_outside_any_stage_blames_no_stage():
    telemetry = build(steady())
    # stretch every third request span by 200 ms of untraced time after its stages
    telemetry.spans = [
        Span(s.trace_id, s.span_id, None, s.name, s.start_ns, s.end_ns + 200_000_000, {}, s.resource)
        if s.name == semconv.SPAN_REQUEST and int(s.span_id[-4:], 16) % 3 == 0
        else s
        for s in telemetry.spans
    ]
    report = diagnose(telemetry)
    assert report.total is not None and report.total.max_ms > 300
    assert (report.verdict.cause, report.verdict.stage) == (None, None)
    assert any("outside the stage spans" in e for e in report.verdict.evidence)


def test_cold_start_with_steady_warm_runs():
    rows = steady()
    rows[0] = {**rows[0], FORWARD: 3000.0, DECODE: 30.0}
    report = diagnose(build(rows))
    assert (report.verdict.cause, report.verdict.stage) == ("cold_start", FORWARD)
    assert report.cold_start is not None
    assert report.cold_start.stages_ms[FORWARD] == pytest.approx(3000.0)
    assert report.stages[FORWARD].max_ms < 200  # the cold request is kept out of warm stats
    assert report.warm_requests == 29


def test_cold_start_and_warm_swing_names_the_warm_cause():
    rows = steady(queue=lambda i, r: 1.0 if i % 3 else 150.0)
    rows[0] = {**rows[0], FORWARD: 3000.0}
    report = diagnose(build(rows))
    assert (report.verdict.cause, report.verdict.stage) == ("queue", QUEUE)
    assert report.to_dict()["cold_start"]["total_ms"] > 3000
    assert any("cold start" in e for e in report.verdict.evidence)


def test_first_request_not_far_above_is_not_a_cold_start():
    rows = steady()
    rows[0] = {**rows[0], FORWARD: 130.0}
    report = diagnose(build(rows))
    assert report.verdict.cause == "stable"
    assert report.cold_start is not None  # still reported apart


def _swinging_forward() -> Recording:
    return build(steady(forward=lambda i, r: 100.0 if i % 3 else 600.0))


def test_gpu_busy_and_starved_from_metric_points():
    busy = _swinging_forward()
    busy.metrics = gpu_points(busy, 0.95)
    starved = _swinging_forward()
    starved.metrics = gpu_points(starved, 0.1)
    assert diagnose(busy).verdict.cause == "gpu_busy"
    assert diagnose(starved).verdict.cause == "gpu_starved"


def _one_sample_in_each_of(telemetry: Recording, n_forwards: int, value: float) -> list[MetricPoint]:
    warm_forwards = sorted((s.start_ns, s.end_ns) for s in telemetry.spans if s.name == FORWARD)[1:]
    return [
        MetricPoint(semconv.HW_GPU_UTILIZATION, (a + b) // 2, value, {semconv.HW_ID: "GPU-0"})
        for a, b in warm_forwards[:n_forwards]
    ]


def test_gpu_evidence_too_thin_gives_forward():
    # 10 warm forwards; one 95 % sample in each of 4 of them: 40 % coverage but < 5 samples
    rows = steady(n=11, forward=lambda i, r: 100.0 if i % 3 else 600.0)
    thin = build(rows)
    thin.metrics = _one_sample_in_each_of(thin, MIN_GPU_SAMPLES - 1, 0.95)
    report = diagnose(thin)
    assert (report.verdict.cause, report.verdict.stage) == ("forward", FORWARD)
    assert report.gpu.level == "thin"
    assert report.gpu.samples == MIN_GPU_SAMPLES - 1
    assert any("too thin" in e for e in report.verdict.evidence)
    # 10 warm requests: tentative, so the first advice is to run more; then why the GPU could not
    # decide (not "enable the sampler")
    assert report.verdict.tentative and "10 more times" in report.verdict.advice[0]
    assert "too few GPU samples" in report.verdict.advice[1]
    # one more sample crosses the threshold
    enough = build(rows)
    enough.metrics = _one_sample_in_each_of(enough, MIN_GPU_SAMPLES, 0.95)
    assert diagnose(enough).verdict.cause == "gpu_busy"


def test_gpu_samples_covering_few_forwards_give_forward():
    telemetry = _swinging_forward()
    # plenty of samples, but all inside the first two forwards: under 30 % coverage
    first_two = [s for s in telemetry.spans if s.name == FORWARD][1:3]
    telemetry.metrics = [
        MetricPoint(semconv.HW_GPU_UTILIZATION, s.start_ns + k * 10_000_000, 0.95)
        for s in first_two
        for k in range(8)
    ]
    report = diagnose(telemetry)
    assert report.gpu.samples >= MIN_GPU_SAMPLES
    assert report.verdict.cause == "forward"


def test_no_gpu_data_gives_forward():
    report = diagnose(_swinging_forward())
    assert report.verdict.cause == "forward"
    assert report.gpu.level == "none"


def test_gpu_starved_from_forward_span_attributes():
    telemetry = build(
        steady(forward=lambda i, r: 100.0 if i % 3 else 600.0),
        forward_attrs=lambda i: {semconv.GPU_UTILIZATION_MEAN: 0.08, semconv.GPU_SAMPLE_COUNT: 3},
    )
    report = diagnose(telemetry)
    assert report.verdict.cause == "gpu_starved"
    assert report.gpu.source == "span_attributes"


def test_preprocess_cost_follows_pixels():
    sizes = [(320, 240, 40_000), (4032, 3024, 5_000_000), (1280, 960, 300_000)]
    images = [sizes[i % 3] for i in range(30)]
    rows = steady(decode=lambda i, r: images[i][0] * images[i][1] / 100_000 * r.uniform(0.95, 1.05))
    report = diagnose(build(rows, images=images))
    assert (report.verdict.cause, report.verdict.stage) == ("preprocess", DECODE)
    assert any("follows image size: pixels" in e for e in report.verdict.evidence)
    assert "follows image size" in report.verdict.advice[0]


def test_preprocess_cost_not_following_size_says_so():
    sizes = [(320, 240, 40_000), (4032, 3024, 5_000_000)]
    images = [sizes[i % 2] for i in range(30)]
    rows = steady(decode=lambda i, r: 150.0 if i % 3 == 0 else 8.0)  # unrelated to size
    report = diagnose(build(rows, images=images))
    assert report.verdict.cause == "preprocess"
    assert any("does not follow image pixels" in e for e in report.verdict.evidence)
    assert "does not follow image size" in report.verdict.advice[0]


def test_comparison_says_the_bottleneck_moved():
    before = build(steady(decode=lambda i, r: 8.0 if i % 3 else 200.0))
    after = build(steady(queue=lambda i, r: 150.0 if i % 3 else 1.0))
    report = diagnose(after, baseline=before)
    comparison = report.to_dict()["comparison"]
    assert comparison["bottleneck_moved"] is True
    assert comparison["baseline_verdict"] == {"cause": "preprocess", "stage": DECODE}
    assert comparison["verdict"] == {"cause": "queue", "stage": QUEUE}
    assert any("moved from decode (preprocess) to queue (queue)" in s for s in comparison["summary"])
    assert comparison["stages"][QUEUE]["change_ms"] > 0


def test_comparison_same_bottleneck_does_not_claim_a_move():
    rows = steady(decode=lambda i, r: 8.0 if i % 3 else 200.0)
    report = diagnose(build(rows), baseline=build(rows))
    assert report.comparison is not None
    assert report.comparison.bottleneck_moved is False
    assert any("still decode" in s for s in report.comparison.summary)


def test_each_process_has_its_own_cold_request():
    a = steady(seed=1)
    b = steady(seed=2)
    a[0] = {**a[0], FORWARD: 3000.0}
    b[0] = {**b[0], FORWARD: 2800.0}
    telemetry = build(a, instance="proc-a")
    telemetry.extend(build(b, instance="proc-b", start_ns=T0_NS + 10_000_000_000))
    report = diagnose(telemetry)
    assert report.cold_start is not None and report.cold_start.count == 2
    assert report.warm_requests == 58
    assert report.verdict.cause == "cold_start"


def test_request_span_under_http_server_span_and_missing_request_span():
    telemetry = build(steady(n=3))
    http = []
    spans = []
    for s in telemetry.spans:
        if s.name == semconv.SPAN_REQUEST:
            parent = "ffff" + s.span_id[4:]
            http.append(Span(s.trace_id, parent, None, "POST /infer", s.start_ns - 1000, s.end_ns + 1000))
            s = Span(s.trace_id, s.span_id, parent, s.name, s.start_ns, s.end_ns)
        spans.append(s)
    requests = find_requests(spans + http)
    assert len(requests) == 3
    assert all(r.span_id is not None and set(r.stages_ms) == set(semconv.STANDARD_STAGES) for r in requests)
    # drop the request spans: the stages' parent never arrived, so they are no requests but
    # incomplete units, one per missing parent, named in the problems
    orphans = [s for s in telemetry.spans if s.name != semconv.SPAN_REQUEST]
    grouping = group_spans(orphans)
    assert grouping.requests == [] and find_requests(orphans) == []
    assert len(grouping.incomplete) == 3
    assert all(u.missing_parent_id is not None for u in grouping.incomplete)
    assert set(grouping.incomplete[0].stages) == set(semconv.STANDARD_STAGES)
    assert any("3 incomplete traces left out" in p for p in grouping.problems)


def test_cold_start_attribute_false_everywhere_means_no_cold_request():
    telemetry = build(steady())
    telemetry.spans = [
        Span(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_ns, s.end_ns,
             {semconv.REQUEST_COLD_START: False}, s.resource)
        if s.name == semconv.SPAN_REQUEST else s
        for s in telemetry.spans
    ]
    report = diagnose(telemetry)
    assert report.cold_start is None
    assert report.warm_requests == report.requests == 30


def test_failed_requests_are_counted_but_kept_out_of_the_statistics():
    rows = steady(25)
    telemetry = build(rows)
    # Request 10 failed in decode after 0.1 ms: it would otherwise be the fastest "warm run".
    failed_trace = next(s.trace_id for s in telemetry.spans if s.name == semconv.SPAN_REQUEST
                        and s.start_ns > T0_NS + 9 * 100_000_000)
    telemetry.spans[:] = [
        Span(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_ns,
             s.start_ns + 100_000 if s.name == DECODE else s.end_ns, s.attributes, s.resource,
             error=s.name in (DECODE, semconv.SPAN_REQUEST))
        if s.trace_id == failed_trace else s
        for s in telemetry.spans
        if not (s.trace_id == failed_trace and s.name in (RESIZE, QUEUE, FORWARD))
    ]
    report = diagnose(telemetry).to_dict()
    assert report["requests"] == 25
    assert report["stages"][DECODE]["min_ms"] > 7.0  # the 0.1 ms failed decode is not a run
    assert any("1 of 25 requests ended with an error and was left out" in e for e in report["verdict"]["evidence"])
    from otel_stages.render import render_text

    assert "25 requests (23 warm, 1 cold, 1 failed)" in render_text(diagnose(telemetry))


def _nested(n: int = 30, *, http: bool = False, request_span: bool = True) -> list[Span]:
    """``request -> download, preprocess -> (decode, resize), forward``; decode swings (every
    third request +60 ms). ``http`` puts an HTTP server span above the request span;
    ``request_span=False`` leaves the request span out (stages grouped by trace)."""
    spans: list[Span] = []
    t = T0_NS
    for i in range(n):
        trace = f"{i + 1:032x}"
        req, pre, server = (f"{i + 1:012x}{tail}" for tail in ("0000", "0001", "00ff"))
        decode_ms = 8.0 + (60.0 if i % 3 == 0 else 0.0)
        times = {"download": 3.0, "decode": decode_ms, "resize": 3.0, "forward": 100.0}
        cursor = t
        windows = {}
        for name, ms in times.items():
            windows[name] = (cursor, cursor + int(ms * 1e6))
            cursor = windows[name][1]
        for j, name in enumerate(times):
            parent = pre if name in (DECODE, RESIZE) else req
            spans.append(Span(trace, f"{i + 1:012x}{j + 16:04x}", parent, name, *windows[name]))
        spans.append(Span(trace, pre, req, "preprocess", windows[DECODE][0], windows[RESIZE][1]))
        if request_span:
            spans.append(Span(trace, req, server if http else None, semconv.SPAN_REQUEST, t, cursor,
                              {semconv.REQUEST_SEQ: i + 1}))
        if http:
            spans.append(Span(trace, server, None, "POST /infer", t - 1000, cursor + 1000))
        t = cursor + 50_000_000
    random.Random(5).shuffle(spans)
    return spans


@pytest.mark.parametrize(
    "http, request_span", [(False, True), (True, True), (False, False), (True, False)]
)
def test_stages_nested_in_a_custom_stage_belong_to_the_outer_request(http, request_span):
    spans = _nested(http=http, request_span=request_span)
    if not request_span:  # the stages' parent never arrived: incomplete, group and all
        grouping = group_spans(spans)
        assert grouping.requests == [] and len(grouping.incomplete) == 30
        assert all(set(u.stages) >= {DOWNLOAD, DECODE, RESIZE, FORWARD} for u in grouping.incomplete)
        report = diagnose(Recording(spans=spans))
        assert report.requests == 0 and report.counts.incomplete == 30
        assert report.verdict.cause is None
        return
    requests = find_requests(spans)
    assert len(requests) == 30
    assert all(set(r.stages_ms) == {DOWNLOAD, DECODE, RESIZE, FORWARD} for r in requests)
    assert all([g.name for g in r.groups] == ["preprocess"] for r in requests)
    assert all(r.total_ms == pytest.approx(sum(r.stages_ms.values()), abs=0.01) for r in requests)
    report = diagnose(Recording(spans=spans))
    assert report.requests == 30
    assert (report.verdict.cause, report.verdict.stage) == ("preprocess", DECODE)
    assert "preprocess" not in report.stages  # a group: its time is its children's
    assert sum(s.share for s in report.stages.values()) < 1.05
    assert report.total is not None and report.total.min_ms > 110
    assert report.groups == {"preprocess": [DECODE, RESIZE]}
    assert report.to_dict()["groups"] == {"preprocess": [DECODE, RESIZE]}


def test_a_request_in_another_service_below_a_custom_stage_stays_apart():
    # gateway: request -> download, call_model; model server below call_model:
    # POST /infer -> <inner> -> decode, forward. Two requests, whatever the inner span's name.
    ms = 1_000_000
    for inner in (semconv.SPAN_REQUEST, "handle"):
        spans = [
            Span("a" * 32, "1" * 16, None, semconv.SPAN_REQUEST, T0_NS, T0_NS + 200 * ms),
            Span("a" * 32, "2" * 16, "1" * 16, DOWNLOAD, T0_NS, T0_NS + 10 * ms),
            Span("a" * 32, "3" * 16, "1" * 16, "call_model", T0_NS + 10 * ms, T0_NS + 200 * ms),
            Span("a" * 32, "4" * 16, "3" * 16, "POST /infer", T0_NS + 20 * ms, T0_NS + 190 * ms),
            Span("a" * 32, "5" * 16, "4" * 16, inner, T0_NS + 20 * ms, T0_NS + 190 * ms),
            Span("a" * 32, "6" * 16, "5" * 16, DECODE, T0_NS + 20 * ms, T0_NS + 30 * ms),
            Span("a" * 32, "7" * 16, "5" * 16, FORWARD, T0_NS + 30 * ms, T0_NS + 190 * ms),
        ]
        found = find_requests(spans)
        assert [sorted(r.stages_ms) for r in found] == [["call_model", DOWNLOAD], [DECODE, FORWARD]]
        assert [r.groups for r in found] == [(), ()]


def test_stages_without_their_request_span_are_not_requests_and_invent_nothing():
    spans = _nested(n=3, request_span=False)
    spans += [s for s in _nested(n=1) if s.name == semconv.SPAN_REQUEST]  # one real seq-1 request
    grouping = group_spans(spans)
    assert [r.seq for r in grouping.requests] == [1]
    assert sum(r.cold for r in grouping.requests) == 1
    assert len(grouping.incomplete) == 2  # requests 2 and 3 lost their request span


def test_size_evidence_is_one_sentence_for_pixels_and_bytes():
    sizes = [(320, 240, 40_000), (4032, 3024, 6_000_000), (1280, 960, 600_000)]
    images = [sizes[i % 3] for i in range(30)]
    rows = steady(decode=lambda i, r: images[i][0] * images[i][1] / 100_000 * r.uniform(0.95, 1.05))
    evidence = diagnose(build(rows, images=images)).verdict.evidence
    size_lines = [e for e in evidence if e.startswith("decode time ")]
    assert len(size_lines) == 1, evidence
    assert re.fullmatch(r"decode time follows image size: pixels \(r = [01]\.\d\d\) and bytes"
                        r" \(r = [01]\.\d\d\)", size_lines[0])


def test_size_sentence_says_which_measure_follows_more():
    from otel_stages.analysis.evidence import size_sentence

    assert size_sentence("decode", [("pixels", 0.95), ("bytes", 0.75)]) == (
        "decode time follows image size, pixels (r = 0.95) more closely than bytes (r = 0.75)")
    assert size_sentence("resize", [("pixels", 0.91), ("bytes", 0.2)]) == (
        "resize time follows image pixels (r = 0.91), not bytes (r = 0.20)")
    assert size_sentence("decode", [("pixels", 0.1), ("bytes", -0.2)]) == (
        "decode time does not follow image pixels (r = 0.10) or bytes (r = -0.20)")


def test_sub_millisecond_stages_keep_their_digits_in_the_evidence():
    # queue 10 µs .. 40 µs: varies 4x, far too small to matter, and must not read 0.0..0.0 ms
    rows = steady(decode=lambda i, r: 150.0 if i % 3 == 0 else 8.0,
                  queue=lambda i, r: 0.010 + 0.030 * (i % 2))
    evidence = diagnose(build(rows)).verdict.evidence
    line = next(e for e in evidence if e.startswith("queue varies"))
    assert "(10 µs .. 40 µs) but only by 30 µs" in line
    assert not any(re.search(r"\b0\.0 ms|-0%|-1%", e) for e in evidence)


def test_custom_wrapper_stage_recorded_with_the_real_api(captured_fake_clock):
    """The tester's repro: request(); stage download; stage preprocess (decode, resize); forward."""
    import otel_stages

    cap, clock = captured_fake_clock
    for i in range(30):
        with otel_stages.request():
            for name, ms in ((DOWNLOAD, 3.0), ("preprocess", None), (FORWARD, 100.0)):
                with otel_stages.stage(name):
                    if ms is not None:
                        clock.advance_ms(ms)
                        continue
                    with otel_stages.stage(DECODE):
                        clock.advance_ms(8.0 + (60.0 if i % 3 == 1 else 0.0))
                    with otel_stages.stage(RESIZE):
                        clock.advance_ms(3.0)
        clock.advance_ms(50.0)
    spans = [
        Span(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}",
             None if s.parent is None else f"{s.parent.span_id:016x}", s.name, s.start_time,
             s.end_time, dict(s.attributes))
        for s in cap.spans
    ]
    report = diagnose(Recording(spans=spans))
    assert report.requests == 30
    assert (report.verdict.cause, report.verdict.stage) == ("preprocess", DECODE)
    assert report.total is not None and report.total.min_ms == pytest.approx(114.0)


def test_forward_advice_says_why_the_gpu_evidence_did_not_decide():
    rows = steady(n=25, forward=lambda i, r: 100.0 if i % 3 else 600.0)
    none = diagnose(build(rows))
    assert none.verdict.cause == "forward" and "enable the GPU sampler" in none.verdict.advice[0]
    medium = build(rows)
    medium.metrics = gpu_points(medium, 0.5)  # between the starved and busy thresholds
    report = diagnose(medium)
    assert report.gpu.level == "medium" and report.verdict.cause == "forward"
    assert "in between" in report.verdict.advice[0]
    assert not any("enable the GPU sampler" in a for a in report.verdict.advice)


class _Transient(Exception):
    pass


def test_a_stage_error_the_service_caught_does_not_fail_the_request(tmp_path):
    """Recorded through the real library: half the requests retry a download that raised (the
    stage span records the error, the service answers); one request's error escapes request()."""
    import otel_stages as ots
    from otel_stages.analysis import load_paths

    telemetry = ots.configure(service_name="retry", data_dir=tmp_path, gpu="off", set_global=False)
    ots.mark_cold_start()  # this process may have numbered requests before: the first here is cold
    for i in range(12):
        with ots.request():
            if i % 2:
                try:
                    with ots.stage(DOWNLOAD):
                        raise _Transient("connection reset")
                except _Transient:
                    pass  # retried below: the request still answers
            with ots.stage(DOWNLOAD):
                pass
            with ots.stage(FORWARD):
                pass
    with pytest.raises(_Transient), ots.request(), ots.stage(FORWARD):
        raise _Transient("model crashed")
    telemetry.shutdown()
    recording = load_paths(sorted(tmp_path.glob("*.jsonl")))
    assert sum(1 for s in recording.spans if s.error) == 6 + 2  # caught: stage only; escaped: both
    report = diagnose(recording)
    assert (report.requests, report.counts.failed, report.counts.cold) == (13, 1, 1)
