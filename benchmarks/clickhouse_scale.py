"""Benchmark (not a test): the ClickHouse report over 10 million spans in embedded chDB.

1. **Fill** (one child process): creates the Collector ``clickhouse`` exporter's tables with its
   own DDL (``otel_stages.analysis.clickhouse.create_tables``) and generates, inside the engine
   (``INSERT ... SELECT ... FROM numbers(N)``, no Python loop), spans of the library's own shape:
   per request a ``request`` span (``request.seq``, ``request.cold_start`` on the first of each
   process, ``request.id``, ``image.size``) and its ``download``, ``decode`` (``image.width`` /
   ``height`` / ``size`` / ``format`` / ``mode``), ``resize``, ``queue`` (``queue.depth``) and
   ``forward`` (``batch.size``) children, 6 spans per request, from ``--processes`` processes
   (``service.instance.id``), four input sizes whose decode cost follows the pixels, a bimodal
   forward; plus ``hw.gpu.utilization`` / ``hw.gpu.memory.usage`` / ``hw.gpu.memory.limit``
   gauges every second per process (the sampler's default interval).
2. **Report** (fresh child processes, interleaved with a baseline): ``fetch_aggregates`` over the
   whole table, i.e. everything ``report --clickhouse chdb:PATH`` computes; wall time and the
   process's peak RSS (``ru_maxrss``: chDB's engine, its caches and Python together).
   Baseline: one bare scan in a fresh process, ``quantilesExactInclusive`` of ``Duration`` per
   ``SpanName`` over the same table (reading the data once); the report's cost is given as a
   ratio to it as well as in seconds.
3. **Client side of a server report**: a fresh process that imports the package and
   clickhouse-connect (not chDB) and builds the result from the answer rows the engine returned
   in step 2 (the same bytes a server would send): the report's own footprint against a server.
   No ClickHouse server runs on this machine, so this is measured without one.

Engine settings for the report: ``max_memory_usage`` (``--max-memory-mb``) over the report's
defaults (``clickhouse_sql.DEFAULT_SETTINGS``: spill thresholds, small insert blocks). Memory is
bounded by the report's design rather than by spilling: requests are grouped in time slices of
about a million spans (chDB's external aggregation measured ~10x slower than slicing here).

Each report run also lists its costliest statements (process CPU seconds per statement, the
engine's threads included; ``TOP_STATEMENTS=N`` in the environment lists N, default 8).
``--against ROOT`` runs another checkout's report (``ROOT``, e.g. a ``git worktree`` of the
commit before a change) on the same data, interleaved with this one's (alternating which goes
first), and gives the CPU ratio per round.

Usage: ``python benchmarks/clickhouse_scale.py [--spans 10000000] [--repeat 3] [--path DIR]
[--keep] [--against ROOT]`` (``--smoke``: 60 000 spans, one repeat; what the tests run). Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPANS_PER_REQUEST = 6
#: Start of the generated data (2026-01-01T00:00:00Z) and the gap between a process's requests.
T0_NS = 1_767_225_600 * 10**9
REQUEST_INTERVAL_NS = 600 * 10**6
#: The costliest statements listed per report run (by process CPU seconds; the environment
#: reaches the child processes).
TOP_STATEMENTS = int(os.environ.get("TOP_STATEMENTS", "8"))


def _fill_sql(traces: str, gauge: str, spans: int, processes: int) -> list[str]:
    requests = spans // SPANS_PER_REQUEST
    per_process = -(-requests // processes)
    seconds = per_process * REQUEST_INTERVAL_NS // 10**9 + 2
    # request r: process r % P, seq r // P + 1; h: per-request pseudo-random bits
    spans_sql = f"""INSERT INTO {traces}
    (Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName,
     ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, Duration, StatusCode, StatusMessage)
SELECT
    fromUnixTimestamp64Nano(start_ns), lower(leftPad(hex(r + 1), 32, '0')),
    lower(leftPad(hex(r * 8 + kind + 1), 16, '0')),
    if(kind = 0, '', lower(leftPad(hex(r * 8 + 1), 16, '0'))), '',
    ['request', 'download', 'decode', 'resize', 'queue', 'forward'][kind + 1],
    if(kind = 0, 'Server', 'Internal'), 'vlm-server',
    map('service.name', 'vlm-server', 'service.instance.id', concat('pod-', toString(proc)),
        'telemetry.sdk.language', 'python', 'telemetry.sdk.name', 'opentelemetry',
        'telemetry.sdk.version', '1.45.1', 'host.name', concat('gpu-node-', toString(intDiv(proc, 8)))),
    'otel_stages', '0.1.0',
    multiIf(
        kind = 0, if(seq = 1,
            map('request.id', concat('r', toString(r)), 'request.seq', toString(seq),
                'request.cold_start', 'true', 'image.size', toString(bytes)),
            map('request.id', concat('r', toString(r)), 'request.seq', toString(seq),
                'image.size', toString(bytes))),
        kind = 2, map('image.width', toString(w), 'image.height', toString(hgt),
                      'image.size', toString(bytes), 'image.format', 'JPEG', 'image.mode', 'RGB'),
        kind = 3, map('image.target_width', '224', 'image.target_height', '224'),
        kind = 4, map('queue.depth', toString(h % 4)),
        kind = 5, map('batch.size', toString(1 + h % 8)),
        map()),
    toUInt64(dur_ns), 'Unset', ''
FROM (
    SELECT n, r, kind, proc, seq, h, w, hgt, bytes, base,
        [toInt64(2000000 + h % 3000000),                               -- download
         toInt64(w * hgt * (6 + bitShiftRight(h, 8) % 4)),                       -- decode: follows pixels
         toInt64(w * hgt * 2 + bitShiftRight(h, 12) % 500000),                   -- resize
         toInt64(pow(bitShiftRight(h, 16) % 100, 2) * 2000),                     -- queue
         toInt64(if(bitShiftRight(h, 24) % 5 = 0, 400000000, 100000000) + bitShiftRight(h, 28) % 20000000
                 + if(seq = 1, 3000000000, 0))] AS d,                 -- forward (cold: +3 s)
        arrayCumSum(arrayMap(x -> x + 50000, d)) AS ends,
        if(kind = 0, base, base + ends[kind] - d[kind]) AS start_ns,
        if(kind = 0, ends[5] + 100000, d[kind]) AS dur_ns
    FROM (
        SELECT number AS n, intDiv(n, {SPANS_PER_REQUEST}) AS r, n % {SPANS_PER_REQUEST} AS kind,
            r % {processes} AS proc, intDiv(r, {processes}) + 1 AS seq, cityHash64(r) AS h,
            [1024, 640, 1920, 4032][1 + h % 4] AS w, [768, 480, 1080, 3024][1 + h % 4] AS hgt,
            intDiv(w * hgt, 4) AS bytes,
            toInt64({T0_NS} + (seq - 1) * {REQUEST_INTERVAL_NS} + proc * 1000003) AS base
        FROM numbers({requests * SPANS_PER_REQUEST})
    )
)"""
    gauge_sql = f"""INSERT INTO {gauge}
    (ResourceAttributes, ScopeName, ScopeVersion, ServiceName, MetricName, MetricUnit, Attributes,
     StartTimeUnix, TimeUnix, Value)
SELECT
    map('service.name', 'vlm-server', 'service.instance.id', concat('pod-', toString(proc))),
    'otel_stages.gpu', '0.1.0', 'vlm-server',
    ['hw.gpu.utilization', 'hw.gpu.memory.usage', 'hw.gpu.memory.limit'][metric + 1],
    ['1', 'By', 'By'][metric + 1],
    map('hw.id', concat('GPU-', toString(proc)), 'hw.type', 'gpu'),
    fromUnixTimestamp64Nano(toInt64({T0_NS})), fromUnixTimestamp64Nano(t),
    [0.3 + 0.6 * ((cityHash64(proc, t) % 1000) / 1000), 4.0e10 + (cityHash64(t, proc) % 1000) * 1e7,
     8.0e10][metric + 1]
FROM (
    SELECT number AS n, n % 3 AS metric, intDiv(n, 3) % {processes} AS proc,
        toInt64({T0_NS} + intDiv(n, 3 * {processes}) * 1000000000 + proc * 1000003) AS t
    FROM numbers({3 * processes * seconds})
)"""
    return [spans_sql, gauge_sql]


def child_fill(path: str, spans: int, processes: int) -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    from otel_stages.analysis.clickhouse import Tables, connect, create_tables, parse_url

    tables = Tables()
    t0 = time.perf_counter()
    with connect(parse_url(f"chdb:{path}")) as engine:
        create_tables(engine, tables)
        for statement in _fill_sql(tables.traces_ref, tables.gauge_ref, spans, processes):
            engine.execute(statement, None, {"max_insert_threads": 2})
        counts = engine.rows(f"SELECT (SELECT count() FROM {tables.traces_ref}) AS spans,"
                             f" (SELECT count() FROM {tables.gauge_ref}) AS points,"
                             f" (SELECT sum(bytes_on_disk) FROM system.parts WHERE active"
                             f" AND database = 'default') AS bytes")[0]
    return {"fill_s": time.perf_counter() - t0, **counts,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _statement_label(query: str) -> str:
    """A statement's first words (its kind and, for a table it fills, the table's name)."""
    words = " ".join(query.split())
    return words[:70]


def _timed(engine_class: type, spent: dict[str, float]) -> None:
    """Wraps ``engine_class``'s ``rows`` / ``execute`` to add each statement's process CPU
    seconds (user+sys, the engine's threads included) to ``spent`` by its label."""
    for name in ("rows", "execute"):
        plain = getattr(engine_class, name)

        def timed(self: object, query: str, *args: object, _plain: object = plain,
                  **kwargs: object) -> object:
            before = resource.getrusage(resource.RUSAGE_SELF)
            try:
                return _plain(self, query, *args, **kwargs)  # type: ignore[operator]
            finally:
                after = resource.getrusage(resource.RUSAGE_SELF)
                label = _statement_label(query)
                spent[label] = spent.get(label, 0.0) + (
                    after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        setattr(engine_class, name, timed)


def child_report(path: str, max_memory_mb: int, dump: str, root: str = str(ROOT)
                 ) -> dict[str, object]:
    sys.path.insert(0, root)
    from otel_stages.analysis import clickhouse_engine, clickhouse_figures, clickhouse_sql
    from otel_stages.analysis.clickhouse import Tables, connect, parse_url, run_queries
    from otel_stages.analysis.clickhouse_result import build_aggregates

    spent: dict[str, float] = {}
    _timed(clickhouse_engine._ChdbEngine, spent)

    settings = {**clickhouse_sql.DEFAULT_SETTINGS, "max_memory_usage": max_memory_mb * 2**20}
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tables = Tables()
    query = clickhouse_sql.AggregateQuery(settings=settings)
    t0 = time.perf_counter()
    with connect(parse_url(f"chdb:{path}")) as engine:
        results, method = run_queries(engine, tables, query)
    agg = build_aggregates(results, url=f"chdb:{path}", method=method, start_ns=None,
                           end_ns=None, service=None)
    verdict = clickhouse_figures.verdict(agg)  # Figures -> the one rule set, as the CLI does
    wall = time.perf_counter() - t0
    Path(dump).write_text(json.dumps({"results": results, "method": method}))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:TOP_STATEMENTS]
    return {"root": root, "report_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "statements_cpu_s": sum(spent.values()),
            "top_statements": [[label, round(cpu, 2)] for label, cpu in top],
            "rss_mb": usage.ru_maxrss / 1024,
            "rss_after_import_mb": rss_import, "requests": agg.counts.requests,
            "warm": agg.counts.warm, "set_apart": agg.counts.set_apart, "stages": list(agg.stages),
            "gpu_samples": agg.gpu.samples,
            "cohorts": agg.cohorts_total, "quantiles": agg.quantile_function,
            "verdict": [verdict.cause, verdict.stage]}


def child_scan(path: str, max_memory_mb: int) -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    from otel_stages.analysis.clickhouse import Tables, connect, parse_url

    settings = {"max_memory_usage": max_memory_mb * 2**20}
    t0 = time.perf_counter()
    with connect(parse_url(f"chdb:{path}")) as engine:
        engine.rows(f"SELECT SpanName, quantilesExactInclusive(0.05, 0.5, 0.95)(Duration)"
                    f" FROM {Tables().traces_ref} GROUP BY SpanName", None, settings)
    return {"scan_s": time.perf_counter() - t0,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child_client(dump: str) -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    import clickhouse_connect  # noqa: F401 - what a server report imports

    from otel_stages.analysis import clickhouse_figures
    from otel_stages.analysis.clickhouse_result import build_aggregates

    data = json.loads(Path(dump).read_text())
    agg = build_aggregates(data["results"], url="http://server", method=data["method"],
                           start_ns=None, end_ns=None, service=None)
    json.dumps(agg.to_dict())
    clickhouse_figures.verdict(agg)
    return {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "answer_bytes": len(json.dumps(data["results"]))}


def _child(*args: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child {args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-memory-mb", type=int, default=700,
                        help="ClickHouse max_memory_usage per statement (default 700)")
    parser.add_argument("--path", help="data folder (default: a temporary one, removed after)")
    parser.add_argument("--keep", action="store_true", help="reuse --path if already filled")
    parser.add_argument("--smoke", action="store_true", help="60 000 spans, one repeat")
    parser.add_argument("--against", metavar="ROOT",
                        help="another checkout of otel-stages whose report runs interleaved with"
                             " this one's (a before/after on the same data, same load)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        funcs = {"fill": lambda: child_fill(rest[0], int(rest[1]), int(rest[2])),
                 "report": lambda: child_report(rest[0], int(rest[1]), rest[2], *rest[3:]),
                 "scan": lambda: child_scan(rest[0], int(rest[1])),
                 "client": lambda: child_client(rest[0])}
        print(json.dumps(funcs[kind]()))
        return
    if args.smoke:
        args.spans, args.repeat, args.processes = 60_000, 1, 20
    folder = args.path or tempfile.mkdtemp(prefix="otel-stages-ch-")
    dump = os.path.join(tempfile.gettempdir(), f"otel-stages-ch-answer-{os.getpid()}.json")
    try:
        fill = None
        if not (args.keep and Path(folder, "store").exists()):
            shutil.rmtree(folder, ignore_errors=True)
            fill = _child("fill", folder, str(args.spans), str(args.processes))
        reports, scans, against = [], [], []
        for i in range(args.repeat):  # interleaved: scan, report, scan, report ...
            scans.append(_child("scan", folder, str(args.max_memory_mb)))
            if args.against and i % 2:  # the other code first every second round
                against.append(_child("report", folder, str(args.max_memory_mb), dump + ".b",
                                      str(Path(args.against).resolve())))
            reports.append(_child("report", folder, str(args.max_memory_mb), dump))
            if args.against and not i % 2:
                against.append(_child("report", folder, str(args.max_memory_mb), dump + ".b",
                                      str(Path(args.against).resolve())))
        client = _child("client", dump)
    finally:
        if not args.path:
            shutil.rmtree(folder, ignore_errors=True)
        Path(dump).unlink(missing_ok=True)
        Path(dump + ".b").unlink(missing_ok=True)
    report_s = [float(r["report_s"]) for r in reports]  # type: ignore[arg-type]
    scan_s = [float(s["scan_s"]) for s in scans]  # type: ignore[arg-type]
    print(json.dumps({
        "spans": args.spans, "processes": args.processes, "fill": fill,
        "report_s": report_s, "report_median_s": statistics.median(report_s),
        "report_peak_rss_mb": max(float(r["rss_mb"]) for r in reports),  # type: ignore[arg-type]
        "report_cpu_s": [r["cpu_s"] for r in reports],
        "scan_s": scan_s, "report_to_scan_ratio": statistics.median(
            r / s for r, s in zip(report_s, scan_s)),
        "client_rss_mb": client["rss_mb"], "answer_bytes": client["answer_bytes"],
        "reports": reports, "scans": scans,
        **({"against": against, "against_cpu_s": [r["cpu_s"] for r in against],
            "cpu_ratio_to_against": [float(r["cpu_s"]) / float(a["cpu_s"])  # type: ignore[arg-type]
                                     for r, a in zip(reports, against)]} if against else {}),
    }, indent=2))


if __name__ == "__main__":
    main()
