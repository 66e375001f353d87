"""How the report's cost grows with the number of spans: grouping (otel_stages.analysis.requests)
and the whole diagnosis must stay linear, since a later loader streams a million spans.

Builds N synthetic requests (a request span and five stage spans each, two input sizes, a few
orphan stage spans) and times ``group_spans`` and ``diagnose`` at N and 2N, interleaved and
repeated; prints the 2N / N time ratios (about 2 for linear work, about 4 for quadratic).

    python benchmarks/report_scale.py            # N = 20000 requests (120k spans)
    python benchmarks/report_scale.py --smoke    # N = 500, one round: a quick check that it runs
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from otel_stages import semconv
from otel_stages.analysis import Recording, Span, diagnose
from otel_stages.analysis.requests import group_spans

T0 = 1_790_000_000_000_000_000
MS = 1_000_000


def spans_for(n: int, seed: int = 0) -> list[Span]:
    rng = random.Random(seed)
    resource = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: "p1"}
    out: list[Span] = []
    t = T0
    for i in range(n):
        trace, req = f"{i:032x}", f"{i:012x}ffff"
        big = i % 3 == 0
        stage_ms = [2.0, 40.0 if big else 8.0, 3.0, rng.expovariate(1 / 5), 90.0 * rng.uniform(0.9, 1.1)]
        cursor = t
        for j, (name, ms) in enumerate(zip(semconv.STANDARD_STAGES, stage_ms)):
            end = cursor + int(ms * MS)
            attrs = ({semconv.IMAGE_WIDTH: 4032 if big else 1024, semconv.IMAGE_HEIGHT: 3024 if big else 768}
                     if name == semconv.STAGE_DECODE else {})
            out.append(Span(trace, f"{i:012x}{j:04x}", req, name, cursor, end, attrs, resource))
            cursor = end
        out.append(Span(trace, req, None, semconv.SPAN_REQUEST, t, cursor,
                        {semconv.REQUEST_SEQ: i + 1}, resource))
        if i % 1000 == 999:  # an orphan now and then
            out.append(Span(f"{i:031x}f", f"{i:012x}eeee", "dead" * 4, semconv.STAGE_FORWARD, t, t + MS))
        t = cursor + 10 * MS
    rng.shuffle(out)
    return out


def timed(fn, *args) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    n, rounds = (500, 1) if args.smoke else (args.requests, args.rounds)
    small, large = spans_for(n), spans_for(2 * n, seed=1)
    results: dict[str, list[float]] = {"group N": [], "group 2N": [], "diagnose N": [], "diagnose 2N": []}
    for _ in range(rounds):  # interleaved, so load on the host hits both sizes alike
        results["group N"].append(timed(group_spans, small))
        results["group 2N"].append(timed(group_spans, large))
        results["diagnose N"].append(timed(diagnose, Recording(spans=small)))
        results["diagnose 2N"].append(timed(diagnose, Recording(spans=large)))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"N = {n} requests ({len(small)} spans), 2N = {len(large)} spans, median of {rounds}")
    for key, value in med.items():
        print(f"  {key:<12} {value:8.3f} s")
    print(f"  group 2N/N ratio    {med['group 2N'] / med['group N']:.2f} (linear ~2, quadratic ~4)")
    print(f"  diagnose 2N/N ratio {med['diagnose 2N'] / med['diagnose N']:.2f}")


if __name__ == "__main__":
    main()
