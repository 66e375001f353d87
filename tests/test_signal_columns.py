"""The fleet-scale paths of the diagnosis give the very figures of the plain ones: the signals on
numpy columns (analysis/columns.py) against the list functions, the signal table read once and
cut per cohort against one read per cohort, and whole reports on every recorded case.

The rules compare these figures with thresholds, so "the same" is bit for bit (``==`` on floats,
equal JSON), not approximately."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from otel_stages import semconv
from otel_stages.analysis import Span, diagnose, load_paths, signal_figures
from otel_stages.analysis import columns as cols
from otel_stages.analysis.requests import group_spans
from otel_stages.analysis.selection import for_analysis
from otel_stages.analysis.stage_signals import ThrottleSeries, signal_table
from otel_stages.analysis.stats import explained_fraction, percentile

from .test_mechanisms import RESOURCE, recording

CASES = sorted((Path(__file__).parent / "data" / "traces").glob("*.otlp.jsonl"))


def _series(rng: random.Random, n: int) -> list[float]:
    kind = rng.choice(["normal", "ties", "tiny", "huge", "constant"])
    if kind == "ties":
        return [float(rng.choice([1.5, 2.25, 7.0, 0.1])) for _ in range(n)]
    if kind == "tiny":
        return [rng.uniform(0, 1e-9) for _ in range(n)]
    if kind == "huge":
        return [rng.lognormvariate(10, 3) for _ in range(n)]
    if kind == "constant":
        return [3.3] * n
    return [rng.gauss(100, 30) for _ in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_column_statistics_equal_the_list_ones_bit_for_bit(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 4, 5, 17, 100, 1001])
    xs, ys = _series(rng, n), _series(rng, n)
    ax, ay = cols.floats(xs), cols.floats(ys)
    assert cols.median(ax) == statistics.median(xs)
    for q in (0, 5, 25, 50, 75, 95, 100):
        assert cols.percentile(ax, q) == percentile(xs, q)
    assert cols.explained_fraction(ax, ay) == explained_fraction(xs, ys)
    assert cols.logs(cols.floats([abs(v) + 1e-12 for v in xs])) == [math.log(abs(v) + 1e-12)
                                                                    for v in xs]
    assert cols.clip_below(ax - ay, 0.0).tolist() == [max(0.0, x - y) for x, y in zip(xs, ys)]
    assert cols.clip_above(ax, 1.0).tolist() == [min(1.0, x) for x in xs]
    assert cols.median(ax[:0]) is None and cols.percentile(ax[:0], 75) is None


def _signal_rows(rng: random.Random) -> list[dict]:
    rows = []
    for _ in range(rng.choice([3, 6, 30, 200])):
        wall = rng.lognormvariate(3, 0.6)
        row: dict = {"wall": wall}
        if rng.random() < 0.9:
            row["cpu"] = wall * rng.uniform(0.05, 1.1)
        if rng.random() < 0.5:
            row["gc"] = rng.choice([0.0, rng.uniform(0, wall / 2)])
        if rng.random() < 0.3:
            row["lag"] = rng.choice([0.0, rng.uniform(0, wall / 3)])
        if rng.random() < 0.1:
            row["held"] = rng.uniform(1, 50)
        rows.append(row)
    return rows


def _all_signals(rec) -> dict:
    report = diagnose(rec)
    return {stage: sig.to_dict() | {"lines": sig.lines,
                                    "evidence": [m.evidence for m in sig.mechanisms]}
            for stage, sig in report.signals.items()}


@pytest.mark.parametrize("seed", range(25))
def test_signals_on_columns_equal_the_list_functions(seed, monkeypatch):
    rec = recording(_signal_rows(random.Random(seed)), stage=random.Random(seed).choice(
        ["decode", "download", "resize"]))
    fast = _all_signals(rec)
    monkeypatch.setattr(signal_figures, "_LISTS_ONLY", True)
    assert _all_signals(rec) == fast


def test_nan_goes_through_the_list_functions():
    rows = [{"wall": 10.0 + i, "cpu": 5.0 + (i % 3)} for i in range(12)]
    rows[4]["cpu"] = math.nan
    rec = recording(rows)
    warm = [r for r in group_spans(rec.spans).requests if not r.cold]
    table = signal_table(warm, None, ThrottleSeries([]))
    samples = table.stages["decode"].samples()
    expected = signal_figures._figures_from_lists(
        "decode", [s.wall_ms for s in samples], [s.cpu_ms for s in samples],
        [s.gc_ms for s in samples], [s.lag_ms for s in samples],
        [s.throttled_ms for s in samples], None)
    got = signal_figures.figures_of("decode", table.stages["decode"], None)
    # NaN != NaN: compared as JSON text
    assert json.dumps(got.to_dict()) == json.dumps(expected.to_dict())
    assert "NaN" in json.dumps(got.cpu.to_dict())  # the NaN run did reach the figures


def test_a_subset_of_the_table_is_the_table_of_the_subset():
    rng = random.Random(7)
    rec = recording(_signal_rows(rng) + _signal_rows(rng))
    # some requests without the stage, a held span on another stage
    rec.spans[:] = [s for i, s in enumerate(rec.spans) if not (s.name == "decode" and i % 7 == 1)]
    first = next(s for s in rec.spans if s.name == "forward")
    rec.spans.append(Span(first.trace_id, "00000000000000aa", first.parent_span_id, "resize",
                          first.start_ns, first.start_ns + 1, {semconv.EVENT_LOOP_HELD_MS: 9.0},
                          RESOURCE))
    warm = group_spans(rec.spans).requests
    throttle = ThrottleSeries([])
    whole = signal_table(warm, None, throttle)
    rows = sorted({0, *rng.sample(range(len(warm)), len(warm) // 3)})
    cut = whole.subset(rows)
    fresh = signal_table([warm[i] for i in rows], None, throttle)
    assert cut.requests == fresh.requests and set(cut.stages) == set(fresh.stages)
    for name, columns in fresh.stages.items():
        for a, b in zip(cols_of(cut.stages[name]), cols_of(columns)):
            assert np.array_equal(a, b)
    assert cut.held == fresh.held and cut.holders() == fresh.holders()


def cols_of(columns) -> list:
    return [getattr(columns, f) for f in columns.__dataclass_fields__]


@pytest.mark.parametrize("path", CASES, ids=[p.name for p in CASES])
def test_whole_reports_equal_with_the_list_functions(path, monkeypatch):
    """Every recorded case: the report's JSON is the same through the columns and the lists."""
    recording_ = load_paths([path], selection=for_analysis())
    fast = json.dumps(diagnose(recording_).to_dict(), sort_keys=True)
    monkeypatch.setattr(signal_figures, "_LISTS_ONLY", True)
    assert json.dumps(diagnose(recording_).to_dict(), sort_keys=True) == fast


def test_preprocess_rows_read_once_give_the_facts_of_each_subset():
    from otel_stages.analysis.preprocessing import PreprocessRows, preprocess_facts

    path = Path(__file__).parent / "data" / "traces" / "preprocess_mixed_sizes.otlp.jsonl"
    warm = [r for r in group_spans(load_paths([path]).spans).requests if not r.cold]
    rows = PreprocessRows()
    assert preprocess_facts(warm, rows) == preprocess_facts(warm)
    for part in (warm[::2], warm[1::3], [r for r in warm if (r.image_width or 0) > 1000]):
        assert preprocess_facts(part, rows) == preprocess_facts(part)


def test_preprocess_rows_keep_each_value_as_recorded():
    """Rows share repeated tuples; 1 and True are equal keys but only True says "on a loop"."""
    import msgspec

    from otel_stages.analysis.preprocessing import PreprocessRows, preprocess_facts

    rec = recording([{"wall": 10.0 + i} for i in range(4)])
    spans = []
    for i, span in enumerate(s for s in rec.spans if s.name == "decode"):
        running = True if i % 2 else 1
        spans.append(msgspec.structs.replace(span, attributes={
            semconv.THREAD_NAME: "loop", semconv.EVENT_LOOP_RUNNING: running}))
    rec.spans[:] = [s for s in rec.spans if s.name != "decode"] + spans
    warm = [r for r in group_spans(rec.spans).requests if not r.cold]
    facts = preprocess_facts(warm, PreprocessRows())
    assert facts.threads is not None
    assert (facts.threads.loop_known, facts.threads.on_loop) == (2, 2)
    assert facts == preprocess_facts(list(reversed(warm)), PreprocessRows())


def test_cohort_verdicts_do_not_need_the_per_request_evidence():
    """diagnosis._cohorts leaves the stage evidence out of a cohort's figures (verdict_only): the
    cause, stage and tentative flag it keeps come out the same with it, on every recorded case."""
    from otel_stages.analysis import diagnosis as dg
    from otel_stages.analysis.cohorts import CohortKeys, group
    from otel_stages.analysis.decision import MIN_WARM_RUNS, decide

    checked = set()
    for path in CASES:
        rec = load_paths([path], selection=for_analysis())
        requests = group_spans(rec.spans).requests
        keys = CohortKeys(requests)
        warm = [r for r in requests if not r.cold and not r.error]
        cold = [r for r in requests if r.cold and not r.error]
        for key, reqs in group(warm, keys).items():
            if len(reqs) < MIN_WARM_RUNS:
                continue
            own_cold = [c for c in cold if keys.key(c) == key]
            full = decide(dg._warm(reqs, own_cold, rec.metrics, keys).figures)
            short = decide(dg._warm(reqs, own_cold, rec.metrics, keys, verdict_only=True).figures)
            assert (short.cause, short.stage, short.tentative) == (
                full.cause, full.stage, full.tentative), (path.name, key)
            checked.add(full.cause)
    assert {"gpu_busy", "gc_pause", "cpu_contention", "event_loop_blocked"} <= checked, checked
