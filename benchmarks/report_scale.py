"""Scale: ``otel-stages report --json`` on 10k / 100k / 1M-span OTLP/JSON files, against a bare
standard-library pass over the same file (``json.loads`` per line, sum durations by span name),
measured in the same run, interleaved. Targets (issue 8): the report within 1.5x of the bare pass
at 1M spans (aim 1.0x), peak memory under 1 GB (aim 300 MB), time linear from 10k to 1M.

The files have the library's own span shapes. They are made in two steps:

1. **Real instrumentation into the real file exporter**: ``otel_stages.configure()`` (its
   OTLP/JSON file exporter behind the SDK's ``BatchSpanProcessor``) records 30 requests of the
   library's pipeline in this process: ``imaging.download`` from a local HTTP server, ``imaging.decode``
   and ``imaging.resize`` of real JPEGs (640x480 and 1600x1200, so there are two input cohorts),
   the ``queue`` hand-off (``handoff.enqueue_token``/``dequeue``) and a ``forward`` stage: six
   spans per request with exactly the attributes the library writes (``url.full``,
   ``http.response.status_code``, ``image.*``, ``queue.depth``, ``request.seq``, and issue 13's
   signals: ``thread.cpu_time_ms``, ``thread.name``, ``otel_stages.gc.pause_ms``...).
2. **Replication with new ids**: those requests are copied, round-robin, with fresh random trace
   and span ids, times moved so requests follow each other (stage durations scaled by 0.8-1.3,
   nesting kept, ``thread.cpu_time_ms`` scaled alike, so no two spans share a CPU time),
   ``request.seq`` renumbered and ``request.cold_start`` true only on the first;
   written as the exporter writes them, one export request of 512 spans per line (the
   ``BatchSpanProcessor`` batch size), so a request's spans are often split across two lines.

Every measurement is a separate process, as a user runs them: wall time, CPU time (user + system;
steadier on a busy host) and peak resident memory (``os.wait4``). The ratio is report / bare of
the medians per size.

    python benchmarks/report_scale.py                      # 10k, 100k, 1M spans, 3 rounds
    python benchmarks/report_scale.py --sizes 10000,100000 --rounds 5
    python benchmarks/report_scale.py --parsers            # JSON parsers on these lines
    python benchmarks/report_scale.py --smoke              # tiny, one round: that it all runs

Generated files are kept in ``--data-dir`` (default: ``otel-stages-scale`` in the temp folder)
and reused while the generator version is the same (1M spans is 400 MB).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Bumped when the files change, so old ones are not reused (2: issue 13's signal attributes).
GENERATOR_VERSION = 2
#: Span attributes in ms that scale with the span's duration when a request is replicated.
SCALED_MS_ATTRIBUTES = frozenset({"thread.cpu_time_ms"})
#: Spans per line: the SDK BatchSpanProcessor's default max_export_batch_size.
SPANS_PER_LINE = 512
TEMPLATE_REQUESTS = 30
SIZES = (10_000, 100_000, 1_000_000)
SMOKE_SIZES = (1_200,)
T0_NS = 1_790_000_000_000_000_000

#: The baseline: what any reader of these files must at least do.
BARE_PASS = """
import json, sys
from collections import defaultdict
sums = defaultdict(int)
with open(sys.argv[1], "rb") as f:
    for line in f:
        doc = json.loads(line)
        for rs in doc.get("resourceSpans", ()):
            for ss in rs.get("scopeSpans", ()):
                for s in ss.get("spans", ()):
                    sums[s["name"]] += int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])
print(json.dumps(sums))
"""


# --- step 1: the library's own spans, through its own exporter ------------------------------------


def record_templates(folder: Path) -> dict[str, Any]:
    """Run the real pipeline for :data:`TEMPLATE_REQUESTS` requests into ``folder``; returns the
    exporter's resource and scope and the requests' spans as the file holds them."""
    import functools
    import http.server
    import io
    import queue
    import threading

    from PIL import Image

    import otel_stages
    from otel_stages import handoff, imaging

    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    for name, size in (("small.jpg", (640, 480)), ("large.jpg", (1600, 1200))):
        buffer = io.BytesIO()
        Image.effect_noise(size, 40).convert("RGB").save(buffer, "JPEG", quality=85)
        (images / name).write_bytes(buffer.getvalue())

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(images)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    telemetry = otel_stages.configure(service_name="scale-bench", data_dir=folder / "telemetry",
                                      gpu="off")
    waiting: queue.Queue[handoff.QueueToken] = queue.Queue()
    try:
        for i in range(TEMPLATE_REQUESTS):
            with otel_stages.request():
                name = "large.jpg" if i % 3 == 0 else "small.jpg"
                data = imaging.download(f"http://127.0.0.1:{server.server_port}/{name}")
                imaging.resize(imaging.decode(data), (224, 224))
                waiting.put(handoff.enqueue_token(depth=waiting.qsize()))
                with handoff.dequeue(waiting.get()), otel_stages.stage("forward", **{"batch.size": 1}):
                    sum(range(20_000))  # stands in for the model call
    finally:
        telemetry.shutdown()
        server.shutdown()
    by_trace: dict[str, list[dict[str, Any]]] = {}
    resource = scope = None
    for path in sorted((folder / "telemetry").glob("traces-*.jsonl")):
        for line in path.read_bytes().splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                resource = rs["resource"]
                for ss in rs["scopeSpans"]:
                    scope = ss["scope"]
                    for span in ss["spans"]:
                        by_trace.setdefault(span["traceId"], []).append(span)
    requests = [spans for spans in by_trace.values() if len(spans) == 6]
    if len(requests) != TEMPLATE_REQUESTS:
        raise SystemExit(f"expected {TEMPLATE_REQUESTS} six-span requests, got {len(requests)}")
    return {"resource": resource, "scope": scope, "requests": requests}


# --- step 2: replicate with new ids ---------------------------------------------------------------


def write_spans(path: Path, n_spans: int, templates: dict[str, Any], seed: int = 0) -> None:
    """Write ``n_spans`` spans (whole requests, the last one cut if needed) as OTLP/JSON lines."""
    rng = random.Random(seed)
    requests = templates["requests"]
    t = T0_NS
    batch: list[dict[str, Any]] = []
    written = 0
    with path.open("w", encoding="utf-8") as out:

        def flush() -> None:
            doc = {"resourceSpans": [{"resource": templates["resource"],
                                      "scopeSpans": [{"scope": templates["scope"], "spans": batch}]}]}
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")

        k = 0
        while written < n_spans:
            template = requests[0] if k == 0 else requests[1 + (k - 1) % (len(requests) - 1)]
            request = next(s for s in template if s["name"] == "request")
            origin = int(request["startTimeUnixNano"])
            scale = rng.uniform(0.8, 1.3)
            trace_id = f"{rng.getrandbits(128):032x}"
            ids = {s["spanId"]: f"{rng.getrandbits(64):016x}" for s in template}
            end_ns = t
            for span in template:
                copy = dict(span, traceId=trace_id, spanId=ids[span["spanId"]])
                if "parentSpanId" in span:
                    copy["parentSpanId"] = ids[span["parentSpanId"]]
                start = t + int((int(span["startTimeUnixNano"]) - origin) * scale)
                end = t + int((int(span["endTimeUnixNano"]) - origin) * scale)
                copy["startTimeUnixNano"], copy["endTimeUnixNano"] = str(start), str(end)
                end_ns = max(end_ns, end)
                if any(a["key"] in SCALED_MS_ATTRIBUTES for a in span.get("attributes", ())):
                    copy["attributes"] = [
                        {"key": a["key"], "value": {"doubleValue": a["value"]["doubleValue"] * scale}}
                        if a["key"] in SCALED_MS_ATTRIBUTES and "doubleValue" in a["value"] else a
                        for a in span["attributes"]
                    ]
                if span["name"] == "request":
                    copy["attributes"] = [
                        *(a for a in copy.get("attributes", ())
                          if a["key"] not in ("request.seq", "request.cold_start")),
                        {"key": "request.seq", "value": {"intValue": str(k + 1)}},
                        {"key": "request.cold_start", "value": {"boolValue": k == 0}},
                    ]
                batch.append(copy)
                written += 1
                if len(batch) == SPANS_PER_LINE:
                    flush()
                    batch = []
                if written == n_spans:
                    break
            t = end_ns + 2_000_000
            k += 1
        if batch:
            flush()


def data_files(folder: Path, sizes: tuple[int, ...]) -> dict[int, Path]:
    """The file for each size, generated when missing."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {n: folder / f"spans-{n}-v{GENERATOR_VERSION}.otlp.jsonl" for n in sizes}
    missing = [n for n, p in paths.items() if not p.exists()]
    if missing:
        # a fresh folder: the exporter's files of an earlier run would be read as templates too
        templates = record_templates(Path(tempfile.mkdtemp(prefix="templates-", dir=folder)))
        for n in missing:
            print(f"writing {paths[n]} ...", file=sys.stderr, flush=True)
            part = paths[n].with_suffix(".part")
            write_spans(part, n, templates)
            part.replace(paths[n])
    return paths


# --- measuring ------------------------------------------------------------------------------------


#: Runs a command and reports its own wall time, CPU time and peak RSS. It is a small process of
#: its own because a child's peak RSS starts at its parent's (fork, then exec, keeps the high-water
#: mark), and the benchmark process holds the generator's data.
LAUNCHER = """
import json, os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "rss_mb": usage.ru_maxrss / 1024, "exit": os.waitstatus_to_exitcode(status)}))
"""


def run(command: list[str]) -> dict[str, float]:
    """Run ``command`` to its end; wall and CPU seconds and peak RSS (MB) of that process alone."""
    done = subprocess.run([sys.executable, "-c", LAUNCHER, *command], capture_output=True, text=True)
    try:
        result: dict[str, float] = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{' '.join(command)}: no measurement ({done.stderr[-2000:]})") from None
    if result.pop("exit") != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    return result


def commands(path: Path) -> dict[str, list[str]]:
    return {
        "bare": [sys.executable, "-c", BARE_PASS, str(path)],
        "report": [sys.executable, "-m", "otel_stages.cli", "report", "--json", str(path)],
    }


def measure(paths: dict[int, Path], rounds: int) -> dict[int, dict[str, list[dict[str, float]]]]:
    """Interleaved: every round runs bare and report for every size, alternating which goes first."""
    results: dict[int, dict[str, list[dict[str, float]]]] = {
        n: {"bare": [], "report": []} for n in paths}
    for r in range(rounds):
        for n, path in paths.items():
            order = ["bare", "report"] if r % 2 == 0 else ["report", "bare"]
            for name in order:
                results[n][name].append(run(commands(path)[name]))
                print(f"round {r + 1} {n} spans {name}: {results[n][name][-1]}", file=sys.stderr,
                      flush=True)
    return results


def summary(results: dict[int, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    rows = {}
    for n, runs in results.items():
        med = {name: {k: statistics.median(m[k] for m in ms) for k in ("wall_s", "cpu_s", "rss_mb")}
               for name, ms in runs.items()}
        rows[n] = {
            "bare": med["bare"],
            "report": med["report"],
            "ratio_wall": med["report"]["wall_s"] / med["bare"]["wall_s"],
            "ratio_cpu": med["report"]["cpu_s"] / med["bare"]["cpu_s"],
            "report_us_per_span_cpu": med["report"]["cpu_s"] / n * 1e6,
        }
    sizes = sorted(rows)
    growth = {f"{b}/{a}": rows[b]["report"]["cpu_s"] / rows[a]["report"]["cpu_s"] / (b / a)
              for a, b in itertools.pairwise(sizes)}
    return {"sizes": rows, "cpu_growth_per_span": growth}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'spans':>9} {'bare s':>8} {'report s':>9} {'ratio':>6} {'bare cpu':>9} "
          f"{'report cpu':>11} {'ratio':>6} {'µs/span':>8} {'bare RSS':>9} {'report RSS':>11}")
    for n, row in result["sizes"].items():
        print(f"{n:>9} {row['bare']['wall_s']:>8.2f} {row['report']['wall_s']:>9.2f}"
              f" {row['ratio_wall']:>6.2f} {row['bare']['cpu_s']:>9.2f} {row['report']['cpu_s']:>11.2f}"
              f" {row['ratio_cpu']:>6.2f} {row['report_us_per_span_cpu']:>8.2f}"
              f" {row['bare']['rss_mb']:>6.0f} MB {row['report']['rss_mb']:>8.0f} MB")
    for span, factor in result["cpu_growth_per_span"].items():
        print(f"CPU time per span, {span} spans: x{factor:.2f} (1.00 = linear)")


def check_report(path: Path, n_spans: int) -> None:
    """The report on a generated file finds every whole request (one of them cold, and those the
    report sets apart as cold: the recorded template's requests right after the cold one can
    stand out as a warm-up on a loaded machine) and the cut last one as incomplete, and nothing
    else to complain about."""
    done = subprocess.run(commands(path)["report"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    whole, cut = divmod(n_spans, 6)
    apart = len(report.get("set_apart") or [])
    expected = {"warm": whole - 1 - apart, "cold": 1 + apart, "failed": 0,
                "incomplete": 1 if cut else 0}
    if report["counts"] != expected or len(report["problems"]) != expected["incomplete"]:
        raise SystemExit(f"unexpected report on {path}: counts {report['counts']} (expected"
                         f" {expected}), problems {report['problems'][:3]}")


# --- JSON parsers on these lines --------------------------------------------------------------------


def compare_parsers(path: Path, rounds: int) -> dict[str, float]:
    """Seconds (best of ``rounds``, interleaved) to decode every line of ``path`` and sum span
    durations by name with: the standard library, orjson, msgspec untyped, and msgspec decoding
    into typed structs (what :mod:`otel_stages.analysis.otlp_fast` does)."""
    import gc

    import msgspec

    from otel_stages.analysis import otlp_fast

    lines = path.read_bytes().splitlines()

    def walk_dicts(loads: Any) -> None:
        sums: dict[str, int] = {}
        for line in lines:
            for rs in loads(line).get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    for s in ss.get("spans", ()):
                        name = s["name"]
                        sums[name] = sums.get(name, 0) + int(s["endTimeUnixNano"]) - int(
                            s["startTimeUnixNano"])

    def typed() -> None:
        sums: dict[str, int] = {}
        decode = otlp_fast._DECODER.decode
        for line in lines:
            for rs in decode(line).resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        sums[s.name] = sums.get(s.name, 0) + s.end_time_unix_nano - s.start_time_unix_nano

    parsers: dict[str, Any] = {
        "json (standard library)": lambda: walk_dicts(json.loads),
        f"msgspec {msgspec.__version__} untyped": lambda: walk_dicts(msgspec.json.decode),
        f"msgspec {msgspec.__version__} typed structs": typed,
    }
    try:
        import orjson

        parsers[f"orjson {orjson.__version__}"] = lambda: walk_dicts(orjson.loads)
    except ImportError:
        print("orjson is not installed (pip install orjson): left out", file=sys.stderr)
    best = {name: float("inf") for name in parsers}
    for _ in range(rounds):
        for name, fn in parsers.items():
            gc.collect()
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="comma-separated span counts (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "otel-stages-scale")
    parser.add_argument("--parsers", action="store_true", help="compare JSON parsers instead")
    parser.add_argument("--smoke", action="store_true", help="tiny files, one round")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    sizes = SMOKE_SIZES if args.smoke else tuple(int(s) for s in args.sizes.split(","))
    rounds = 1 if args.smoke else args.rounds
    paths = data_files(args.data_dir, sizes)
    if args.parsers:
        path = paths[sorted(paths)[len(paths) // 2]]
        best = compare_parsers(path, rounds)
        base = best["json (standard library)"]
        print(f"decode + sum durations by name, {path.name}, best of {rounds} (CPU s)")
        for name, seconds in best.items():
            print(f"  {name:<34} {seconds:7.3f} s  {seconds / base:5.2f}x")
        return
    for n, path in paths.items():
        check_report(path, n)
    result = summary(measure(paths, rounds))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
