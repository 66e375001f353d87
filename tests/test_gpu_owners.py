"""GPU series are keyed by process, then ``hw.id`` (analysis.gpu_owners): two hosts whose GPU
points share one ``hw.id`` ("0", "GPU-0": unique only within a host) are not merged into one GPU,
and the report says the id repeats."""

from __future__ import annotations

from otel_stages import semconv
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.gpu import LEVEL_HIGH, gpu_evidence
from otel_stages.analysis.gpu_owners import (
    PERCENT_GUESS,
    UNDECLARED_UNIT,
    ambiguous_series,
    ambiguous_unit_lines,
    hw_of,
    is_ambiguous,
    owned_series,
    request_hosts,
    sender_divisors,
    series_hw,
    shared_hw_id_lines,
    shared_hw_ids,
    unplaced_lines,
    unplaced_senders,
)
from otel_stages.analysis.gpu_series import gpu_series
from otel_stages.analysis.model import MetricPoint, Recording, Span
from otel_stages.analysis.requests import find_requests

MS = 1_000_000
T0 = 1_800_000_000 * 1_000_000_000


def _resource(host: str) -> dict[str, object]:
    return {semconv.SERVICE_NAME: "vlm-server", semconv.SERVICE_INSTANCE_ID: host}


def _requests(host: str, n: int) -> list[Span]:
    """``n`` requests of one process, a 200 ms forward each second."""
    res = _resource(host)
    out = []
    for i in range(n):
        trace, start = f"{host}{i:030x}"[-32:], T0 + i * 1000 * MS
        out.append(Span(trace, f"{i + 1:015x}a", None, semconv.SPAN_REQUEST, start, start + 210 * MS,
                        {semconv.REQUEST_SEQ: i + 1}, res))
        out.append(Span(trace, f"{i + 1:015x}b", f"{i + 1:015x}a", semconv.STAGE_FORWARD,
                        start + 5 * MS, start + 205 * MS, {}, res))
    return out


def _gpu(host: str, value: float, hw_id: str = "0", seconds: int = 10) -> list[MetricPoint]:
    """A utilization point every 50 ms (a sampler at 20 Hz) for ``seconds``."""
    res = _resource(host)
    return [MetricPoint(semconv.HW_GPU_UTILIZATION, T0 + k * 50 * MS, value, {semconv.HW_ID: hw_id}, res)
            for k in range(seconds * 20)]


def _two_hosts() -> Recording:
    """Host a: 10 requests, its GPU 90 % busy; host b: 3 requests, its GPU idle (2 %); both
    name their GPU hw.id "0" and sample it all the time."""
    return Recording(spans=_requests("a", 10) + _requests("b", 3),
                     metrics=_gpu("a", 0.9) + _gpu("b", 0.02))


def test_two_hosts_sharing_a_hw_id_are_two_gpus() -> None:
    """Each forward meets its own host's GPU: 9 warm forwards of a at 90 % and 2 of b at 2 % make
    a busy GPU (mean 74 %). Merged by hw.id, every forward would meet both hosts' points and
    read 46 %, a 'medium' GPU that says nothing."""
    rec = _two_hosts()
    warm = [r for r in find_requests(rec.spans) if not r.cold]
    ev = gpu_evidence(warm, rec.metrics)
    assert ev.forwards == ev.forwards_covered == 11
    assert ev.samples == 11 * 4  # the points at +50, +100, +150, +200 ms of each second
    assert ev.mean_utilization is not None
    assert abs(ev.mean_utilization - (9 * 0.9 + 2 * 0.02) / 11) < 1e-9
    assert ev.level == LEVEL_HIGH
    assert ev.hw_id is None  # two processes' GPUs were taken: no single id to name


def test_a_shared_hw_id_is_a_problem_line_in_the_file_report() -> None:
    report = diagnose(_two_hosts())
    (line,) = [p for p in report.problems if "hw.id" in p]
    assert line.startswith("GPU hw.id reported by more than one process: 0 by 2 processes"
                           " (service.name=vlm-server,service.instance.id=a, service.name=vlm-server,service.instance.id=b)")
    assert "not merged" in line


def test_one_process_with_its_gpu_is_not_a_problem() -> None:
    rec = Recording(spans=_requests("a", 10), metrics=_gpu("a", 0.9))
    assert not [p for p in diagnose(rec).problems if "hw.id" in p]
    assert diagnose(rec).gpu.hw_id == "0"


def test_an_exporter_that_ran_no_request_joins_every_process_and_is_not_a_shared_id() -> None:
    """A DCGM exporter (no requests) naming the same GPU as the model's own sampler: on the
    model's host it joins that series (one host: one GPU); with a host unknown on either side it
    is a series of its own (it may be another machine's GPU 0); never a repeated id between
    request processes."""
    for host in ("node-a", None):
        where = {} if host is None else {semconv.HOST_NAME: host}
        exporter = [MetricPoint(p.name, p.time_ns + 1, p.value, p.attributes,
                                {semconv.SERVICE_NAME: "dcgm-exporter", **where}) for p in _gpu("x", 0.8)]
        own = [MetricPoint(p.name, p.time_ns, p.value, p.attributes, {**p.resource, **where})
               for p in _gpu("a", 0.9)]
        points = own + exporter
        hosts = request_hosts([own[0].resource])
        series = owned_series(points, semconv.HW_GPU_UTILIZATION, {"service.name=vlm-server,service.instance.id=a"}, hosts=hosts)
        apart = series_hw("0", f"service.name=dcgm-exporter{'' if host is None else ',host.name=' + host}")
        if host is None:
            assert sorted(series) == [("service.name=vlm-server,service.instance.id=a", "0"), ("service.name=vlm-server,service.instance.id=a", apart)]
            assert [len(v) for _, v in sorted(series.items())] == [200, 200]
            assert hw_of(apart) == "0"
        else:
            assert list(series) == [("service.name=vlm-server,service.instance.id=a", "0")]
            assert len(series["service.name=vlm-server,service.instance.id=a", "0"]) == 2 * 200
        assert shared_hw_ids(points, {"service.name=vlm-server,service.instance.id=a"}) == {}


def test_percent_is_scaled_per_sending_series() -> None:
    """A producer in percent (0..100) beside one in 0..1: each series is scaled on its own."""
    points = _gpu("a", 90.0) + [MetricPoint(p.name, p.time_ns, p.value, p.attributes,
                                            {semconv.SERVICE_NAME: "exp"}) for p in _gpu("x", 0.5)]
    series = owned_series(points, semconv.HW_GPU_UTILIZATION, {"service.name=vlm-server,service.instance.id=a"}, 1.5)
    assert {k[1]: sorted({v for _, v in pts}) for k, pts in series.items()} == {
        "0": [0.9], series_hw("0", "service.name=exp"): [0.5]}


def test_the_line_names_a_handful() -> None:
    shared = {f"GPU-{i}": [f"service.name=vlm-server,service.instance.id=h{k}" for k in range(7)] for i in range(7)}
    (line,) = shared_hw_id_lines(shared)
    assert "GPU-4 by 7 processes (service.name=vlm-server,service.instance.id=h0" in line and "GPU-5 by" not in line
    assert "h4, ...)" in line and "; 2 more." in line
    assert shared_hw_id_lines({}) == []


def test_the_html_charts_draw_one_line_per_host() -> None:
    """The HTML report's GPU series (analysis.gpu_series): one per process and hw.id, so host a's
    90 % and host b's 2 % are two lines, not one zigzag."""
    series = gpu_series(_two_hosts().metrics, T0, T0, T0 + 20 * 1000 * MS)
    assert [(g.process, g.hw_id) for g in series] == [("service.name=vlm-server,service.instance.id=a", "0"),
                                                      ("service.name=vlm-server,service.instance.id=b", "0")]
    assert [{v for _, v in g.utilization} for g in series] == [{0.9}, {0.02}]


def test_an_nvml_uuid_is_one_gpu_whoever_sends_it() -> None:
    """Two exporters on hosts unknown: GPU "0" from each is two series; the same NVML UUID from
    each is one GPU (``MIG-`` too); a UUID cut short is not one."""
    for hw, series_count in (("GPU-5b1e6a4c-7f2d-4a0b-9c3e-1d2f3a4b5c6d", 1),
                             ("MIG-5b1e6a4c-7f2d-4a0b-9c3e-1d2f3a4b5c6d", 1),
                             ("MIG-GPU-5b1e6a4c-7f2d-4a0b-9c3e-1d2f3a4b5c6d/1/0", 1),
                             ("GPU-5b1e6a4c-7f2d-4a0b-9c3e-1d2f3a4b5c6", 2), ("0", 2)):
        points = [MetricPoint(p.name, p.time_ns + k, p.value, {semconv.HW_ID: hw},
                              {semconv.SERVICE_NAME: f"exporter-{k}"})
                  for k in range(2) for p in _gpu("x", 0.5)]
        series = owned_series(points, semconv.HW_GPU_UTILIZATION, {"service.name=vlm-server,service.instance.id=a"})
        assert len(series) == series_count, hw
        assert {hw_of(k[1]) for k in series} == {hw}


# --- an undeclared unit with only 0 and 1: ratio or integer percent, not told apart -------------


def _unit(points: list[MetricPoint], unit: str | None) -> list[MetricPoint]:
    return [MetricPoint(p.name, p.time_ns, p.value, p.attributes, p.resource, unit) for p in points]


def test_only_whole_numbers_up_to_the_guess_without_a_unit_are_ambiguous() -> None:
    assert UNDECLARED_UNIT == "" and PERCENT_GUESS == 1.0
    assert is_ambiguous([0.0, 1.0, 1.0, 0.0], True)
    assert is_ambiguous([1.0], True) and is_ambiguous([0.0, 0.0, 1.0], True)
    assert not is_ambiguous([0.0], True) and not is_ambiguous([0.0, 0.0], True)  # idle either way
    assert not is_ambiguous([0.0, 1.0, 0.37], True)     # one fractional value: a ratio
    assert not is_ambiguous([0.0, 1.0, 2.0], True)      # one value above the guess: percent
    assert not is_ambiguous([0.0, 1.0, 1.0000001], True)
    assert not is_ambiguous([0.0, 1.0], False)          # declared: never


def test_ambiguous_series_are_judged_on_the_undeclared_points() -> None:
    a = _unit(_gpu("a", 1.0), UNDECLARED_UNIT)
    assert ambiguous_series(a) == [("service.name=vlm-server,service.instance.id=a", "0")]
    assert ambiguous_series(_unit(_gpu("a", 1.0), "1")) == []          # our sampler, saturated
    assert ambiguous_series(_unit(_gpu("a", 1.0), None)) == []         # no unit in the source (PromQL)
    # declared points are not guessed, so they neither settle nor join the undeclared ones' guess
    assert ambiguous_series(a + _unit(_gpu("a", 0.0), "1")) == [("service.name=vlm-server,service.instance.id=a", "0")]
    assert ambiguous_series(_unit(_gpu("a", 0.37), UNDECLARED_UNIT)) == []
    # memory points are never utilization series
    mem = [MetricPoint(semconv.HW_GPU_MEMORY_USAGE, p.time_ns, 0.0, p.attributes, p.resource, "")
           for p in a]
    assert ambiguous_series(mem) == []


def test_an_ambiguous_series_is_left_out_of_the_utilization_only() -> None:
    """owned_series with the guess drops it (the verdict); without a scale (memory) nothing is
    dropped; a declared series of the same values stays."""
    amb = _unit(_gpu("a", 1.0), UNDECLARED_UNIT)
    owners = {"service.name=vlm-server,service.instance.id=a"}
    assert owned_series(amb, semconv.HW_GPU_UTILIZATION, owners, PERCENT_GUESS) == {}
    assert len(owned_series(amb, semconv.HW_GPU_UTILIZATION, owners)["service.name=vlm-server,service.instance.id=a", "0"]) == 200
    kept = owned_series(_unit(_gpu("a", 1.0), "1"), semconv.HW_GPU_UTILIZATION, owners, PERCENT_GUESS)
    assert {v for _, v in kept["service.name=vlm-server,service.instance.id=a", "0"]} == {1.0}
    # beside it, another process's fractional series is judged as before
    both = amb + _unit(_gpu("b", 0.9), UNDECLARED_UNIT)
    assert list(owned_series(both, semconv.HW_GPU_UTILIZATION, owners | {"service.name=vlm-server,service.instance.id=b"},
                             PERCENT_GUESS)) == [("service.name=vlm-server,service.instance.id=b", "0")]


def test_the_ambiguous_line_counts_names_one_and_says_the_fix() -> None:
    (line,) = ambiguous_unit_lines([("service.name=vlm-server,service.instance.id=a", "0"), ("service.name=vlm-server,service.instance.id=b", "0")])
    assert "of 2 sending processes (2 series, e.g. service.name=vlm-server,service.instance.id=a hw.id 0)" in line
    (one,) = ambiguous_unit_lines([("service.name=vlm-server,service.instance.id=a", "0"), ("service.name=vlm-server,service.instance.id=a", "1")])
    assert "of 1 sending process (2 series, e.g. service.name=vlm-server,service.instance.id=a hw.id 0)" in one
    assert "'1' for a ratio, '%' for percent" in line and "transform processor" in line
    assert ambiguous_unit_lines([]) == []
    (said,) = [p for p in diagnose(Recording(spans=_requests("a", 10),
                                             metrics=_unit(_gpu("a", 1.0), ""))).problems
               if "without a declared unit" in p]
    assert "of 1 sending process (1 series, e.g. service.name=vlm-server,service.instance.id=a hw.id 0)" in said


def test_the_charts_do_not_draw_an_ambiguous_series_as_100_percent() -> None:
    mem = [MetricPoint(semconv.HW_GPU_MEMORY_USAGE, p.time_ns, 2.0**30, p.attributes, p.resource, "By")
           for p in _gpu("a", 0.0)]
    amb = gpu_series(_unit(_gpu("a", 1.0), "") + mem, T0, T0, T0 + 20 * 1000 * MS)
    assert [(g.hw_id, g.utilization, len(g.memory_used_bytes)) for g in amb] == [("0", (), 200)]
    assert gpu_series(_unit(_gpu("a", 1.0), ""), T0, T0, T0 + 20 * 1000 * MS) == ()
    declared = gpu_series(_unit(_gpu("a", 1.0), "1"), T0, T0, T0 + 20 * 1000 * MS)
    assert {v for _, v in declared[0].utilization} == {1.0}


def test_an_exporter_is_unplaced_only_when_no_request_process_can_take_its_points() -> None:
    """On a host no request process names: unplaced while every request process names a host;
    taken (so not said) when one names none, or when the exporter names no host."""
    def exporter(host: str | None) -> list[MetricPoint]:
        where = {} if host is None else {semconv.HOST_NAME: host}
        return [MetricPoint(p.name, p.time_ns, p.value, p.attributes,
                            {semconv.SERVICE_NAME: "dcgm", **where}) for p in _gpu("x", 0.5)]
    hosted = {"service.name=vlm-server,service.instance.id=a": "node-a"}
    assert unplaced_senders(exporter("node-x"), {"service.name=vlm-server,service.instance.id=a"}, hosted) == [
        ("node-x", "service.name=dcgm,host.name=node-x")]
    assert unplaced_senders(exporter("node-a"), {"service.name=vlm-server,service.instance.id=a"}, hosted) == []
    assert unplaced_senders(exporter(None), {"service.name=vlm-server,service.instance.id=a"}, hosted) == []
    assert unplaced_senders(exporter("node-x"), {"service.name=vlm-server,service.instance.id=a", "service.name=vlm-server,service.instance.id=b"},
                            hosted) == []
    (line,) = unplaced_lines(2, "node-x")
    assert line.startswith("GPU points of 2 processes that ran no request") and "node-x" in line
    assert unplaced_lines(0, "") == []


# --- the unit is guessed per sender, on its undeclared points only ----------------------------


def _exporter(values: dict[str, float], unit: str | None = UNDECLARED_UNIT, shift_s: int = 0
              ) -> list[MetricPoint]:
    """A GPU exporter without requests ("exp") sending each ``hw.id`` at a flat value, one point
    every 50 ms for 10 s from ``shift_s``."""
    res = {semconv.SERVICE_NAME: "dcgm-exporter", semconv.SERVICE_INSTANCE_ID: "exp"}
    return [MetricPoint(semconv.HW_GPU_UTILIZATION, p.time_ns + shift_s * 1000 * MS, p.value,
                        p.attributes, res, unit)
            for hw, v in values.items() for p in _gpu("exp", v, hw)]


def _values(series: dict[tuple[str, str], list[tuple[int, float]]]) -> dict[str, list[float]]:
    return {hw_of(k[1]): sorted({v for _, v in pts}) for k, pts in series.items()}


EXP = "service.name=dcgm-exporter,service.instance.id=exp"
UNDECLARED = EXP, UNDECLARED_UNIT


def test_one_sender_is_judged_on_all_its_gpus() -> None:
    """A DCGM exporter's GPU 0 of 0 and 1 beside its GPU 1 at 2 (just above the guess): the
    exporter writes percent, so GPU 0 reads 0 % and 1 %, not ambiguous. With GPU 1 at 1 (not
    above) every one of its points is 0 or 1: ambiguous, both series left out and named."""
    owners = {"service.name=vlm-server,service.instance.id=a"}
    util = semconv.HW_GPU_UTILIZATION
    percent = _exporter({"0": 0.0}) + _exporter({"0": 1.0, "1": 2.0}, shift_s=10)
    assert sender_divisors(percent) == {UNDECLARED: 100.0}
    assert ambiguous_series(percent) == []
    assert _values(owned_series(percent, util, owners, PERCENT_GUESS)) == {"0": [0.0, 0.01],
                                                                           "1": [0.02]}
    amb = _exporter({"0": 0.0}) + _exporter({"0": 1.0, "1": 1.0}, shift_s=10)
    assert sender_divisors(amb) == {UNDECLARED: None}
    assert ambiguous_series(amb) == [(EXP, "0"), (EXP, "1")]
    assert owned_series(amb, util, owners, PERCENT_GUESS) == {}
    # the charts read it as the verdict does
    drawn = gpu_series(percent, T0, T0, T0 + 30 * 1000 * MS)
    assert [sorted({v for _, v in g.utilization}) for g in drawn] == [[0.0, 0.01], [0.02]]
    assert gpu_series(amb, T0, T0, T0 + 30 * 1000 * MS) == ()


def test_only_zeros_are_idle_and_one_1_makes_them_ambiguous() -> None:
    owners = {"service.name=vlm-server,service.instance.id=a"}
    zeros = _exporter({"0": 0.0, "1": 0.0})
    assert sender_divisors(zeros) == {UNDECLARED: 1.0} and ambiguous_series(zeros) == []
    assert _values(owned_series(zeros, semconv.HW_GPU_UTILIZATION, owners, PERCENT_GUESS)) == {
        "0": [0.0], "1": [0.0]}
    one = zeros + _exporter({"1": 1.0}, shift_s=10)[:1]
    assert sender_divisors(one) == {UNDECLARED: None}
    assert ambiguous_series(one) == [(EXP, "0"), (EXP, "1")]


def test_declared_points_are_never_divided() -> None:
    """A unit fixed partway: integer percent undeclared, then declared '%' (scaled when read) or
    '1'. Only the undeclared points are guessed (95 -> 0.95); the declared 0.95 stays 0.95, not
    0.0095. An ambiguous sender loses its undeclared points only. (A '1' above 1 is still read as
    percent: test_odd_values.test_the_gpu_verdict_reads_the_declared_unit.)"""
    owners = {"service.name=vlm-server,service.instance.id=a"}
    util = semconv.HW_GPU_UTILIZATION
    for declared in ("%", "1"):
        fixed = _exporter({"0": 95.0}) + _exporter({"0": 0.95}, declared, shift_s=10)
        assert _values(owned_series(fixed, util, owners, PERCENT_GUESS)) == {"0": [0.95]}
        drawn = gpu_series(fixed, T0, T0, T0 + 30 * 1000 * MS)
        assert [sorted({v for _, v in g.utilization}) for g in drawn] == [[0.95]]
        # each unit is guessed on its own points: '%' never, '1' only by its own values
        assert sender_divisors(fixed) == {UNDECLARED: 100.0, **({(EXP, "1"): 1.0} if declared == "1" else {})}
        mixed = _exporter({"0": 1.0}) + _exporter({"0": 0.95}, declared, shift_s=10)
        assert _values(owned_series(mixed, util, owners, PERCENT_GUESS)) == {"0": [0.95]}
