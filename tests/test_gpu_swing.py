"""The forward mechanism verdicts judge the forwards that make the swing (otel_stages.analysis.gpu,
gpu_memory, contention): the slow forwards are those beyond the warm forward median plus the run's
noise band; the utilization level is theirs when enough of them are sampled; a busy GPU during
them refutes cpu_contention; memory pressure needs their peak near the limit or memory released
within them. The tester's inputs (tests/data/traces/gpu_swing, README.md there) are cases here and,
through chDB, in tests/test_clickhouse_issues.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from otel_stages import semconv
from otel_stages.analysis import MetricPoint, Recording, diagnose, load_paths
from otel_stages.analysis import gpu as g
from otel_stages.analysis import gpu_memory as gm
from otel_stages.analysis.requests import find_requests
from tests.test_verdict import FORWARD, build, steady

SWING = Path(__file__).parent / "data" / "traces" / "gpu_swing"
GIB = 1024**3


def _run(slow: Callable[[int], bool], slow_util: float | None, fast_util: float | None, *,
         n: int = 30, count: Callable[[int], int] = lambda i: 4, slow_ms: float = 400.0,
         extra: Callable[[int], dict] = lambda i: {}):
    """``n`` requests; forward ``slow_ms`` where ``slow(i)``, else ~100 ms; the forward span
    carries the GPU utilization (``gpu.utilization.mean``, ``count(i)`` samples; no attribute
    where the value or the count is ``None`` / 0)."""
    ms = {i: slow_ms if slow(i) else 100.0 for i in range(n)}

    def attrs(i: int) -> dict:
        util = slow_util if slow(i) else fast_util
        out = dict(extra(i))
        if util is not None and count(i):
            out.update({semconv.GPU_UTILIZATION_MEAN: util, semconv.GPU_SAMPLE_COUNT: count(i)})
        return out

    return build(steady(n, forward=lambda i, r: ms[i]), forward_attrs=attrs)


def _every(k: int) -> Callable[[int], bool]:
    return lambda i: i % k == 2


# --- the slow forwards ------------------------------------------------------------------------


def test_slow_forwards_lie_beyond_the_median_plus_the_band():
    assert g.slow_forward_min_ms(100.0, 30.0) == 130.0
    for ms, slow in ((130.0, 0), (131.0, 1)):
        rec = _run(lambda i: i == 5, 0.1, 0.9, slow_ms=ms)
        requests = [r for r in find_requests(rec.spans) if not r.cold]
        median = sorted(s.end_ns - s.start_ns for r in requests for s in r.spans
                        if s.name == FORWARD)[len(requests) // 2] / 1e6
        ev = g.gpu_evidence(requests, [], band_ms=130.0 - median)  # threshold 130 ms exactly
        assert ev.slow_forwards == slow, ms


def test_the_report_uses_its_own_noise_band():
    report = diagnose(_run(_every(8), 0.05, 0.95))
    assert report.noise is not None and report.gpu.slow_min_ms is not None
    median = sorted(r.stages_ms[FORWARD] for r in report.request_sets.warm)[14]
    assert report.gpu.slow_min_ms == pytest.approx(median + report.noise.band_ms, rel=0.02)


# --- the level on the slow forwards -----------------------------------------------------------


def test_two_starved_slow_forwards_among_busy_fast_ones_are_gpu_starved():
    """A1: the overall mean (about 80 %) would say busy; the slow forwards idle."""
    report = diagnose(_run(lambda i: i in (7, 19), 0.08, 0.95))
    assert report.gpu.judged_on == g.JUDGED_SLOW and report.gpu.slow_forwards == 2
    assert report.gpu.mean_utilization > g.GPU_BUSY_MIN_UTILIZATION  # what used to decide
    assert (report.verdict.cause, report.gpu.level) == ("gpu_starved", "low")
    described = report.gpu.describe()
    assert "during the slow forwards" in described and "8% over" in described
    assert report.verdict.advice[0].startswith("the GPU idles during slow forwards")


def test_busy_slow_forwards_among_idle_fast_ones_are_gpu_busy():
    report = diagnose(_run(_every(8), 0.95, 0.10))
    assert report.gpu.mean_utilization < g.GPU_STARVED_MAX_UTILIZATION
    assert (report.verdict.cause, report.gpu.level) == ("gpu_busy", "high")
    assert report.verdict.advice[0].startswith("the GPU is saturated during slow forwards")


@pytest.mark.parametrize("util, cause", [(0.699, "forward"), (0.7, "gpu_busy")])
def test_busy_threshold_on_the_slow_forwards(util, cause):
    assert g.GPU_BUSY_MIN_UTILIZATION == 0.7
    report = diagnose(_run(_every(8), util, 0.05))
    assert report.gpu.judged_on == g.JUDGED_SLOW
    assert report.verdict.cause == cause


@pytest.mark.parametrize("util, cause", [(0.4, "gpu_starved"), (0.401, "forward")])
def test_starved_threshold_on_the_slow_forwards(util, cause):
    assert g.GPU_STARVED_MAX_UTILIZATION == 0.4
    report = diagnose(_run(_every(8), util, 0.95))
    assert report.gpu.judged_on == g.JUDGED_SLOW
    assert report.verdict.cause == cause


@pytest.mark.parametrize("covered, judged, level", [(1, g.JUDGED_ALL, "thin"),
                                                    (2, g.JUDGED_SLOW, "low")])
def test_min_slow_forwards_covered(covered, judged, level):
    """Slow forwards at 5 % among busy fast ones: one sampled slow forward is not enough to judge
    them apart, and it contradicts the overall mean, so the level is thin (no call)."""
    assert g.MIN_SLOW_FORWARDS_COVERED == 2
    slow = [2, 12, 22]
    rec = _run(lambda i: i in slow, 0.05, 0.95,
               count=lambda i: 0 if i in slow[covered:] else 6)
    report = diagnose(rec)
    assert (report.gpu.judged_on, report.gpu.level) == (judged, level)
    if level == "thin":
        assert report.verdict.cause == "forward"
        assert "point different ways" in report.gpu.describe()
        assert "inside the slow ones" in report.verdict.advice[0]


@pytest.mark.parametrize("covered, judged", [(2, g.JUDGED_ALL), (3, g.JUDGED_SLOW)])
def test_slow_forward_coverage(covered, judged):
    """Of 10 slow forwards at least MIN_FORWARD_COVERAGE (30 %) must be sampled."""
    assert g.MIN_FORWARD_COVERAGE == 0.3
    slow = [i for i in range(30) if i % 3 == 1]
    rec = _run(lambda i: i in slow, 0.05, 0.95,
               count=lambda i: 0 if i in slow[covered:] else 6)
    assert diagnose(rec).gpu.judged_on == judged


@pytest.mark.parametrize("samples, judged", [(4, g.JUDGED_ALL), (5, g.JUDGED_SLOW)])
def test_slow_forward_samples(samples, judged):
    assert g.MIN_GPU_SAMPLES == 5
    slow = [2, 12]
    rec = _run(lambda i: i in slow, 0.05, 0.95,
               count=lambda i: (2 if i == 2 else samples - 2) if i in slow else 6)
    assert diagnose(rec).gpu.judged_on == judged


def test_too_few_sampled_slow_forwards_fall_back_to_all_and_say_so():
    """The one sampled slow forward agrees with the overall mean: the level is the mean's, and
    the evidence says why it is judged on all forwards."""
    slow = [2, 12, 22]
    report = diagnose(_run(lambda i: i in slow, 0.9, 0.95, count=lambda i: 0 if i in slow[1:] else 6))
    assert (report.gpu.judged_on, report.gpu.level, report.verdict.cause) == (
        g.JUDGED_ALL, "high", "gpu_busy")
    assert "judged on all forwards: only 1 of the 3 slow forwards" in report.gpu.describe()
    assert report.verdict.advice[0].startswith("the GPU is saturated during forward:")


@pytest.mark.parametrize("slow_forwards, covered, level", [
    (1, 0, "high"),    # one slow forward: never judged apart, the others' level stands
    (2, 0, "thin"),    # two, none sampled: the samples miss what makes the swing
    (10, 2, "thin"),   # 20 % of them sampled
    (10, 3, "high"),   # 30 %: sampled as often as any forward must be; too few samples to judge
])                     # them apart (3 < MIN_GPU_SAMPLES), and they agree: the overall level
def test_slow_forwards_the_samples_miss_are_not_judged_by_the_others(slow_forwards, covered, level):
    """Busy fast forwards (90 %, 40 covered of 50) and slow forwards that the samples miss: the
    fast forwards' level says nothing about the slow ones (a sampler that stalled with them, or
    their readings unusable), so with two or more slow forwards and under MIN_FORWARD_COVERAGE of
    them sampled no call is made."""
    assert (g.MIN_SLOW_FORWARDS_COVERED, g.MIN_FORWARD_COVERAGE) == (2, 0.3)
    split = g.SplitFigures(slow_forwards=slow_forwards, slow_covered=covered,
                           slow_samples=covered, slow_sum=0.9 * covered,
                           fast_samples=200, fast_sum=180.0)
    ev = g.evidence_of(source="span_attributes", forwards=50, covered=40 + covered,
                       samples=200 + covered, total=180.0 + 0.9 * covered, split=split,
                       slow_min_ms=150.0)
    assert (ev.level, ev.judged_on) == (level, g.JUDGED_ALL)
    assert g.slow_unsampled(slow_forwards, covered) is (level == "thin")
    if level == "thin":
        assert (f"only {covered} of the {slow_forwards} slow forwards (> 150.0 ms) have GPU samples:"
                " the samples miss the forwards that make the swing") in ev.describe()
        assert "point different ways" not in ev.describe()


def test_slow_forwards_without_readings_are_no_call_and_the_advice_says_fix_them():
    """Two forwards per request (a tester's input): the first always sampled at 20 %, the second,
    slow in every fourth request, with an unusable reading (sample count 0). The fast ones said
    gpu_starved with no word of doubt; now no call, and the advice is to fix the values."""
    from otel_stages.analysis import advice

    def attrs(i: int) -> dict:
        return {semconv.GPU_UTILIZATION_MEAN: 0.2, semconv.GPU_SAMPLE_COUNT: 10}

    rec = build(steady(40, forward=lambda i, r: 100.0), forward_attrs=attrs)
    spans = []
    for i, request in enumerate(s for s in rec.spans if s.name == "request"):
        mine = [s for s in rec.spans if s.trace_id == request.trace_id and s is not request]
        first = next(s for s in mine if s.name == FORWARD)
        extra = 20_000_000 + (300_000_000 if i % 4 == 3 else 0)
        second = msgspec.structs.replace(
            first, span_id=first.span_id[:-4] + "ffff", start_ns=first.end_ns,
            end_ns=first.end_ns + extra,
            attributes={semconv.GPU_UTILIZATION_MEAN: 0.95, semconv.GPU_SAMPLE_COUNT: 0})
        # the stages after the forward move by the second one's time, and the request ends later
        spans += [s if s.start_ns < first.end_ns else msgspec.structs.replace(
            s, start_ns=s.start_ns + extra, end_ns=s.end_ns + extra) for s in mine]
        spans += [second, msgspec.structs.replace(request, end_ns=request.end_ns + extra)]
    report = diagnose(Recording(spans=spans))
    assert (report.verdict.cause, report.gpu.level, report.gpu.slow_covered) == ("forward", "thin", 0)
    assert report.gpu.slow_forwards >= 2 and report.gpu.unread_forwards > 0
    assert report.verdict.advice[0] == advice.GPU_UNREAD
    assert "no reading (see the problems)" in report.gpu.describe()


def test_no_slow_forward_judges_all_and_says_so():
    rec = _run(lambda i: False, None, 0.9)
    requests = [r for r in find_requests(rec.spans) if not r.cold]
    ev = g.gpu_evidence(requests, [], band_ms=50.0)
    assert (ev.slow_forwards, ev.judged_on, ev.level) == (0, g.JUDGED_ALL, "high")
    assert "no forward is longer than" in ev.describe()


def test_the_json_names_what_was_judged():
    got = diagnose(_run(_every(8), 0.05, 0.95)).gpu.to_dict()
    assert got["judged_on"] == "slow_forwards" and got["level"] == "low"
    assert got["slow_forwards"] == got["slow_forwards_covered"] == 4
    assert got["slow_forward_mean_utilization"] == 0.05


# --- cpu_contention against a busy GPU ---------------------------------------------------------


def _contention(slow_util: float):
    """Fixed 95 ms of thread CPU time per forward against 100 or 400 ms of wall time (a third
    slow: the contention rule compares the slowest quarter with the faster half)."""
    slow = _every(3)
    return _run(slow, slow_util, slow_util, extra=lambda i: {
        semconv.THREAD_CPU_TIME_MS: 95.0,
        semconv.THREAD_CPU_UTILIZATION: 95.0 / (400.0 if slow(i) else 100.0)})


@pytest.mark.parametrize("util, cause", [(0.69, "cpu_contention"), (0.7, "gpu_busy")])
def test_a_busy_gpu_during_the_slow_forwards_is_not_cpu_contention(util, cause):
    """A9: off-CPU time with the GPU busy is the thread waiting on the device."""
    report = diagnose(_contention(util))
    assert report.verdict.cause == cause
    said = " ".join(report.verdict.evidence)
    if cause == "gpu_busy":
        assert "waiting on the device" in said and "70% busy threshold" in said
        assert not any("give forward a core" in a for a in report.verdict.advice)


# --- GPU memory during the slow forwards --------------------------------------------------------


def _memory_points(rec, inside: Callable[[int, int, int], list[float]]) -> list[MetricPoint]:
    """Memory points at 5 evenly spaced times inside each forward (``inside(i, start, end)``
    gives their bytes), 40 GiB between forwards, and an 80 GiB limit."""
    points = []
    forwards = sorted((s.start_ns, s.end_ns) for s in rec.spans if s.name == FORWARD)
    attrs = {semconv.HW_ID: "GPU-0"}
    for i, (a, b) in enumerate(forwards):
        values = inside(i, a, b)
        for k, v in enumerate(values):
            t = a + (b - a) * k // (len(values) - 1)
            points.append(MetricPoint(semconv.HW_GPU_MEMORY_USAGE, t, v, attrs))
        points.append(MetricPoint(semconv.HW_GPU_MEMORY_USAGE, b + 20_000_000, 40 * GIB, attrs))
        points.append(MetricPoint(semconv.HW_GPU_MEMORY_LIMIT, b + 20_000_000, 80 * GIB, attrs))
    return points


def _memory_run(slow_values: list[float], slow: Callable[[int], bool] | None = None):
    rec = _run(slow or _every(10), 0.95, 0.95)
    flat = [40.5 * GIB] * 5
    rec.metrics = _memory_points(rec, lambda i, a, b: slow_values if (b - a) > 300e6 else flat)
    return diagnose(rec)


def test_memory_growing_with_the_batch_is_not_pressure():
    """A8: +6 GiB of activations in the slow forwards, 57 % of the card: not near the limit and
    never released within a forward."""
    report = _memory_run([40 * GIB, 43 * GIB, 46 * GIB, 46 * GIB, 46 * GIB])
    assert report.verdict.cause == "gpu_busy"
    said = " ".join(report.verdict.evidence)
    assert "grows with the work" in said and "0 of 3 near its limit" in said


def test_memory_released_within_the_slow_forwards_is_pressure():
    report = _memory_run([40 * GIB, 46 * GIB, 40 * GIB, 46 * GIB, 40 * GIB])
    assert report.verdict.cause == "gpu_memory_pressure"
    assert "3 of 3 near its limit" in report.verdict.evidence[-3] or any(
        "allocating and releasing" in e for e in report.verdict.evidence)


def test_memory_near_the_limit_in_the_slow_forwards_is_pressure():
    report = _memory_run([70 * GIB, 73 * GIB, 74 * GIB, 74 * GIB, 74 * GIB])
    assert report.verdict.cause == "gpu_memory_pressure"


def test_memory_pressure_on_a_minority_of_slow_forwards_still_lines_up():
    """3 slow forwards of 30 near the limit: the slowest quarter would hold 5 fast ones too and
    dilute them below half; the slow forwards are those beyond the band."""
    report = _memory_run([74 * GIB] * 5, slow=lambda i: i in (5, 15, 25))
    assert report.verdict.cause == "gpu_memory_pressure"


def test_memory_in_forwards_within_the_band_is_not_the_slow_ones():
    """Forwards a little above the median (110 ms, inside the noise band) are not slow: memory
    pressure in the three 400 ms forwards alone lines up with the swing."""
    ms = {i: 400.0 if i in (5, 15, 25) else 110.0 if i % 3 == 0 else 100.0 for i in range(30)}
    rec = build(steady(30, forward=lambda i, r: ms[i]))
    rec.metrics = _memory_points(rec, lambda i, a, b: [74 * GIB] * 5 if b - a > 300e6
                                 else [40.5 * GIB] * 5)
    report = diagnose(rec)
    assert report.noise is not None and report.noise.band_ms > 10.0
    assert report.verdict.cause == "gpu_memory_pressure"


def _two_gpu_points(rec, values: dict[str, Callable[[bool, int], float]],
                    limits: dict[str, float]) -> list[MetricPoint]:
    """One process, one memory series per ``hw.id`` in ``values`` (``values[hw](slow, k)``: the
    bytes of the k-th of 5 points inside a forward, slow or not) and a limit point per series in
    ``limits`` after each forward: a process whose model spans two GPUs."""
    points = []
    res = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: "proc-1"}  # build()'s
    for a, b in sorted((s.start_ns, s.end_ns) for s in rec.spans if s.name == FORWARD):
        for hw, value in values.items():
            attrs = {semconv.HW_ID: hw}
            points += [MetricPoint(semconv.HW_GPU_MEMORY_USAGE, a + (b - a) * k // 4,
                                   value(b - a > 300e6, k), attrs, res) for k in range(5)]
            if hw in limits:
                points.append(MetricPoint(semconv.HW_GPU_MEMORY_LIMIT, b + 20_000_000, limits[hw],
                                          attrs, res))
    return points


@pytest.mark.parametrize("pressured", ["0", "1"])
def test_memory_pressure_on_either_gpu_of_a_process_is_found(pressured):
    """A model on two GPUs (hw.id 0: 80 GiB, 1: 24 GiB): the pressured one at 94 % of its limit in
    the slow forwards (half of it otherwise), the other at a flat 40 %. Reading one GPU per
    process (the first, or the utilization's) called GPU 1's pressure "clear of its limit"."""
    rec = _run(_every(10), 0.95, 0.95)
    limits = {"0": 80 * GIB, "1": 24 * GIB}
    rec.metrics = _two_gpu_points(rec, {
        hw: (lambda slow, k, lim=lim: (0.94 if slow else 0.5) * lim) if hw == pressured
        else (lambda slow, k, lim=lim: 0.4 * lim) for hw, lim in limits.items()}, limits)
    report = diagnose(rec)
    assert report.verdict.cause == "gpu_memory_pressure", report.verdict.evidence
    assert any("of each GPU's limit (2 GPUs, up to 80 GiB)" in e for e in report.verdict.evidence)
    assert any(e.startswith("2 GPUs: ") for e in report.verdict.evidence)


def test_a_forward_takes_the_highest_of_its_gpus():
    """Per forward, over the GPUs with points inside it (each over its own limit): the highest
    peak (GPU 1: 22.5 of 24 GiB), the highest range and memory released (GPU 0: 32 <-> 36 of 80
    GiB, a range of 4 and 8 released) and the points of both; a series without a limit (hw.id 2)
    is not read."""
    rec = _run(_every(10), 0.95, 0.95)
    churn = [32, 36, 32, 36, 32]
    near = [22, 22.5, 22.5, 22.5, 22.5]
    rec.metrics = _two_gpu_points(rec, {
        "0": lambda slow, k: (churn[k] if slow else 32) * GIB,
        "1": lambda slow, k: (near[k] if slow else 12) * GIB,
        "2": lambda slow, k: 70 * GIB}, {"0": 80 * GIB, "1": 24 * GIB})
    warm = [r for r in find_requests(rec.spans) if not r.cold]
    ev = gm.memory_evidence(warm, rec.metrics)
    assert ev is not None
    assert (ev.gpus, ev.hw_id, ev.limit_bytes) == (2, None, 80 * GIB)
    assert len(ev.covered) == ev.forwards == 29
    slow = [f for f in ev.covered if f.forward_ms > 300]
    assert len(slow) == 3
    for f in slow:
        assert f.peak == pytest.approx(22.5 / 24)
        assert f.range == pytest.approx(4 / 80)
        assert f.released == pytest.approx(8 / 80)
        assert f.samples == 10 and f.under_pressure
    fast = [f for f in ev.covered if f.forward_ms <= 300]
    assert {(f.peak, f.range, f.released, f.samples) for f in fast} == {(0.5, 0.0, 0.0, 10)}


#: The process key of :func:`_two_gpu_points`' process.
P = "service.name=svc,service.instance.id=proc-1"


def _utilization_points(rec, hws: str, inside: dict[str, float] | None = None) -> list[MetricPoint]:
    """``hw.gpu.utilization`` of each GPU in ``hws`` (the process of :func:`_two_gpu_points`):
    60 % (or ``inside[hw]``) at 3 times inside each forward, 5 % 20 ms after it (it rises in the
    forwards)."""
    res = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: "proc-1"}
    points = []
    for a, b in sorted((s.start_ns, s.end_ns) for s in rec.spans if s.name == FORWARD):
        for hw in hws:
            attrs = {semconv.HW_ID: hw}
            level = (inside or {}).get(hw, 0.6)
            points += [MetricPoint(semconv.HW_GPU_UTILIZATION, a + (b - a) * k // 4, level, attrs, res)
                       for k in (1, 2, 3)]
            points.append(MetricPoint(semconv.HW_GPU_UTILIZATION, b + 20_000_000, 0.05, attrs, res))
    return points


@pytest.mark.parametrize("utilization, model, read, pressure", [
    ("0", {P: {"0"}}, "0", False),  # the model's GPU is read: the neighbour's churn is not
    ("1", {P: {"1"}}, "1", True),   # the churning GPU is the model's
    ("", {}, None, True),           # no utilization: every GPU (f2305f1's rule)
    ("01", {P: {"0", "1"}}, None, True),  # both rise alike: a model on both GPUs, both read
    ("2", {P: {"2"}}, None, True),  # the model's GPU has no memory: every GPU
])
def test_the_memory_rule_reads_the_models_gpu(utilization, model, read, pressure):
    """A process whose points hold two GPUs of 80 GiB: GPU 0 at a flat 50 %, GPU 1 (a
    neighbour's, or the model's) releasing 10 % between its points in the slow forwards and flat
    at 40 % otherwise. The GPU whose utilization rises in the forwards
    (:func:`~otel_stages.analysis.gpu.model_gpus`) is the only one read; without one (no
    utilization, a tie, or no memory on it) every GPU is. f2305f1 read every GPU and called the
    neighbour's churn gpu_memory_pressure."""
    rec = _run(_every(10), None, None)
    churn = [0.5, 0.4, 0.5, 0.4, 0.5]
    rec.metrics = _two_gpu_points(rec, {
        "0": lambda slow, k: 0.5 * 80 * GIB,
        "1": lambda slow, k: (churn[k] if slow else 0.4) * 80 * GIB},
        {"0": 80 * GIB, "1": 80 * GIB}) + _utilization_points(rec, utilization)
    warm = [r for r in find_requests(rec.spans) if not r.cold]
    assert g.model_gpus(warm, rec.metrics) == model
    ev = gm.memory_evidence(warm, rec.metrics)
    assert ev is not None
    assert (ev.gpus, ev.hw_id) == ((1, read) if read else (2, None))
    assert all(f.under_pressure == (pressure and f.forward_ms > 300) for f in ev.covered)
    assert (diagnose(rec).verdict.cause == "gpu_memory_pressure") == pressure


def test_a_cohort_reads_the_gpu_the_window_chose():
    """The model's GPU is chosen once over the window's forwards and given to each scope:
    memory_evidence reads the GPU it is given, not the one its own requests would choose."""
    rec = _run(_every(10), None, None)
    churn = [0.5, 0.4, 0.5, 0.4, 0.5]
    rec.metrics = _two_gpu_points(rec, {
        "0": lambda slow, k: 0.5 * 80 * GIB,
        "1": lambda slow, k: (churn[k] if slow else 0.4) * 80 * GIB},
        {"0": 80 * GIB, "1": 80 * GIB}) + _utilization_points(rec, "0")
    warm = [r for r in find_requests(rec.spans) if not r.cold]
    assert gm.memory_evidence(warm, rec.metrics).hw_id == "0"  # chosen over warm
    given = gm.memory_evidence(warm, rec.metrics, model_gpus={P: "1"})
    assert given is not None and given.hw_id == "1"


def test_memory_evidence_uses_the_band():
    ev = gm.MemoryEvidence((), 0, 80 * GIB, None, 100.0, 20.0)
    assert ev.slow_min_ms == 120.0


# --- the tester's inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("name, cause, level", [
    ("s1b_bimodal_2slow", "gpu_starved", "low"),
    ("s1b_bimodal_inverse", "gpu_busy", "high"),
    ("s1_contention_mix", "gpu_busy", "high"),
    ("s7_batch_memory", "gpu_busy", "high"),
])
def test_the_testers_inputs(name, cause, level):
    report = diagnose(load_paths([SWING / f"{name}.otlp.jsonl"]))
    assert (report.verdict.cause, report.verdict.stage, report.gpu.level) == (cause, "forward", level)
    assert report.gpu.judged_on == g.JUDGED_SLOW
    assert not report.verdict.tentative


@pytest.mark.parametrize("mean, level", [
    (0.4000000000000001, "low"),       # a mean of 82 samples at exactly 0.4 (float rounding)
    (0.40000001, "medium"),
    (0.6999999999999999, "high"),
    (0.69999999, "medium"),
])
def test_the_thresholds_read_a_mean_at_the_threshold_as_at_it(mean, level):
    assert g.utilization_level(mean, 100, 10, 10) == level


@pytest.mark.parametrize("span, metric, expected", [
    (g.JUDGED_ALL, g.JUDGED_SLOW, True),
    (g.JUDGED_ALL, g.JUDGED_ALL, False),       # neither can judge the slow forwards: the spans
    (g.JUDGED_SLOW, g.JUDGED_SLOW, False),     # the spans judge them: they win
])
def test_metric_points_win_only_where_the_spans_cannot_judge_the_slow_forwards(span, metric,
                                                                             expected):
    assert g.prefer_metrics(10, span, metric) is expected
    assert g.prefer_metrics(0, g.JUDGED_ALL, g.JUDGED_SLOW) is False  # no slow forward to judge


@pytest.mark.parametrize("gpu1_inside, model", [
    (0.32, {"0"}),       # GPU 1 rises 0.27, under half GPU 0's 0.55: a neighbour
    (0.33, {"0", "1"}),  # 0.28, over half: it works with GPU 0 (tensor parallel)
])
def test_a_gpu_rising_half_as_much_as_the_models_is_the_models_too(gpu1_inside, model):
    """MODEL_GPU_RISE_SHARE: GPU 0 rises from 5 % to 60 % in the forwards; GPU 1 to
    ``gpu1_inside``. Without the share (the top GPU alone) a model split over two GPUs had its
    memory read on one, and pressure on the other went unseen."""
    assert g.MODEL_GPU_RISE_SHARE == 0.5
    rec = _run(_every(10), None, None)
    rec.metrics = _utilization_points(rec, "01", {"1": gpu1_inside})
    warm = [r for r in find_requests(rec.spans) if not r.cold]
    assert g.model_gpus(warm, rec.metrics) == {P: model}
