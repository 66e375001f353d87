"""``otel-stages report [PATH ...] [--json] [--baseline PATH ...] [--top N] [--last-run]
[--fail-on-regression PCT]``.

Reads OTLP/JSON lines files or folders (``-`` is stdin; default: the embedded exporter's folder,
``OTEL_STAGES_DATA_DIR`` or ``./otel-stages-data``), diagnoses them and prints the report as text
or, with ``--json``, as one JSON object (``indent=2``). ``--baseline PATH`` (repeatable, one PATH
each) compares with a recording made before a change; a baseline without requests (missing or
empty files) is exit status 1, not an empty comparison.

A PATH (or --baseline PATH) that does not exist is a usage error (exit 2, nothing read): a typo
must not pass a CI run. Problems inside the input (bad lines, unreadable files) never stop the
report: each is printed to stderr as
``otel-stages: warning: <file>:<line>: ...`` and listed under ``problems``.

``--last-run`` reports only the newest process's requests (the one whose first request started
last; every run read is still listed under ``runs``, and the text header names them); it applies
to the baseline too. ``--fail-on-regression PCT`` (with ``--baseline``) is a CI gate: exit status 3
when the request total's median or p95 rose by more than PCT percent *and* that change is outside
run-to-run noise (the comparison's 95 % bootstrap interval excludes zero, or, for the p95, the share
of requests beyond the baseline's slowest + 50 % rose: the tail test, which also trips any PCT up
to 50 on its own: those requests are over 50 % slower than anything before), or when the failure rate rose
significantly (by more than PCT percent of the baseline's rate; any rise from none); stages are
reported but do not trip the gate, since users feel the total
(:meth:`otel_stages.analysis.comparison.Comparison.regressions`).

Exit status: 0 when at least one request was found; 1 when none was (the message says why on
stderr; with ``--json`` the JSON object is still printed, with ``"requests": 0`` and
``"verdict": {"cause": null, ...}``, so scripts can parse it either way); 2 usage error; 3
``--fail-on-regression`` tripped (the report is printed first); 4 ``--fail-on-regression`` could
not test (fewer than 5 warm requests on a side, or the total's p95 rose by more than PCT percent
while its tail test is only inconclusive: a gate that cannot judge does not pass).

``--service S`` keeps the requests whose request span is of service ``S``, with all their stage
spans (those a GPU worker recorded under them too), and leaves out the other services' requests,
even in the same trace (as ``--clickhouse`` picks them; with ``--jaeger``/``--tempo``, among the
traces fetched); the GPU points kept are those of the services with a span kept and of
metrics-only processes. When no span is of ``S``, the error names the services seen
(:func:`otel_stages.analysis.services.no_service_line`); when ``S``'s spans are all stages of other
services' requests, those services (:func:`otel_stages.analysis.services.no_request_line`).

Remote sources, instead of PATHs (``--since`` like ``30m``, ``1h``, ``2d``; default 1h):

- ``--jaeger URL --service S [--limit N]``: traces from Jaeger's query API, raw span times;
- ``--tempo URL [--query TRACEQL] [--limit N]``: traces from a Tempo TraceQL search;
- ``--prometheus URL [--service S]``: alone, a fleet-wide report from the span-metrics histograms
  (JSON adds ``"source": "prometheus"``; min/max and cold start are unknown there); next to
  ``--jaeger``/``--tempo``, where the GPU utilization samples for the traces come from.
- ``--clickhouse URL [--service S] [--traces-table T] [--gauge-table G]``: statistics computed
  inside ClickHouse over the Collector ``clickhouse`` exporter's tables (see
  :mod:`otel_stages.commands.clickhouse_report`).

A source that cannot be read (unreachable, HTTP error, not JSON) is exit status 1 with the URL and
the server's message on stderr. Mixing PATHs and remote sources is a usage error (exit status 2).

Other servers and namings (see :func:`add_mapping_arguments`): ``--stage-map triton|vllm|FILE``
turns NVIDIA Triton's or vLLM's spans (or any server's, with a map file) into stages before the
diagnosis (JSON adds ``"stage_map"``: :meth:`MapSummary.to_dict
<otel_stages.analysis.stage_map.MapSummary.to_dict>`), the tables in the map's stage order;
without it, "no requests found" names the built-in map whose request spans are there.
``--metric``, ``--span-label``, ``--service-label`` and ``--metric-unit`` pin the span-metrics
naming ``--prometheus`` otherwise discovers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from otel_stages import config
from otel_stages.analysis import Recording, diagnose, load_paths
from otel_stages.analysis.change import MIN_SAMPLES
from otel_stages.analysis.clickhouse_schema import DEFAULT_GAUGE_TABLE, DEFAULT_TRACES_TABLE
from otel_stages.analysis.files import load_bytes, load_stream
from otel_stages.analysis.http_source import SourceError
from otel_stages.analysis.jaeger import DEFAULT_LIMIT
from otel_stages.analysis.report import DEFAULT_TOP
from otel_stages.analysis.requests import find_requests
from otel_stages.analysis.services import (
    no_request_line,
    no_service_line,
    pick_service,
    service_hosts,
    service_of,
    spans_by_service,
)
from otel_stages.analysis.stage_map import StageMapError
from otel_stages.commands import int_at_least
from otel_stages.commands.remote import (
    DEFAULT_SINCE,
    load_remote,
    parse_since,
    run_prometheus,
    warn,
)
from otel_stages.progress import show_progress

if TYPE_CHECKING:
    from otel_stages.analysis import Report
    from otel_stages.analysis.selection import Selection
    from otel_stages.analysis.stage_map import MapSummary

#: The PATH that means standard input.
STDIN = "-"

#: Exit status when --fail-on-regression trips.
EXIT_REGRESSION = 3
#: Exit status when --fail-on-regression cannot judge (too few requests on a side, or an
#: inconclusive tail under a p95 rise past PCT): a gate that cannot test must not pass silently.
EXIT_UNTESTED = 4


def _percent(raw: str) -> float:
    """``10`` / ``2.5`` / ``10%`` -> a percentage >= 0. Raises ``argparse.ArgumentTypeError``."""
    text = raw.strip().removesuffix("%")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 10 or 2.5, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a percentage of 0 or more, got {raw!r}")
    return value


def default_data_dir() -> str:
    """The embedded exporter's folder: ``OTEL_STAGES_DATA_DIR`` if set, else ``otel-stages-data``."""
    return os.environ.get("OTEL_STAGES_DATA_DIR", "").strip() or config.DEFAULT_DATA_DIR


#: ``report --help`` ends with the units of what it prints.
EPILOG = (
    "Units: times are milliseconds (ms) of wall time from the span timestamps; share = percent of"
    " all request time; swing = p95 - p5 in ms; explains = percent of the request total's"
    " variance; image sizes in pixels (width x height), encoded sizes in bytes (kB, MB = 1000s);"
    " GPU utilization in percent, memory in GiB. JSON keys carry their unit (_ms, _ns, _s, _bytes);"
    " share, explains and utilization are fractions 0..1 there. Exit status: 0 report printed, 1"
    " nothing to report or unreadable input, 2 usage error, 3 --fail-on-regression tripped, 4"
    " --fail-on-regression could not judge (too few requests on a side, or an inconclusive tail)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``report``'s arguments on ``parser``."""
    parser.epilog = EPILOG
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="OTLP/JSON lines files or folders (searched recursively for *.jsonl / *.json),"
        " - for stdin; default: $OTEL_STAGES_DATA_DIR or ./otel-stages-data",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--baseline",
        action="append",
        metavar="PATH",
        default=None,
        help="a file or folder recorded before a change: compare against it (repeat the option"
        " for several; one PATH each, so PATHs may come before or after it)",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML report with plots to FILE (opens offline; needs"
        " pip install 'otel-stages[html]'); the text or JSON report is still printed",
    )
    parser.add_argument(
        "--top",
        type=int_at_least(0),
        default=DEFAULT_TOP,
        metavar="N",
        help=f"list the N slowest warm requests, every stage in ms (default {DEFAULT_TOP})",
    )
    parser.add_argument(
        "--last-run",
        action="store_true",
        help="report only the newest process (service instance) read; the others are listed",
    )
    parser.add_argument(
        "--fail-on-regression",
        type=_percent,
        metavar="PCT",
        default=None,
        help="with --baseline: exit 3 when the request total's median or p95 rose by more than PCT"
        " percent beyond run-to-run noise (a slower tail included), or the failure rate rose"
        " significantly (a CI gate)",
    )
    remote = parser.add_argument_group("remote sources (instead of PATH)")
    remote.add_argument(
        "--jaeger",
        metavar="URL",
        help="Jaeger query URL, e.g. http://localhost:16686 (needs --service)",
    )
    remote.add_argument("--tempo", metavar="URL", help="Tempo URL, e.g. http://localhost:3200")
    remote.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus URL, e.g. http://localhost:9090: alone, a fleet-wide report from the"
        " span-metrics histograms; with --jaeger/--tempo, where GPU utilization samples come from",
    )
    remote.add_argument(
        "--service",
        metavar="S",
        help="service.name: whose requests (trace files, --jaeger, --tempo, --clickhouse: those whose"
        " request span is of it, with all their stage spans; other services' requests in the same"
        " traces are left out), the default TraceQL (--tempo), a filter (--prometheus)",
    )
    remote.add_argument(
        "--query",
        metavar="TRACEQL",
        help='Tempo TraceQL query (default {resource.service.name="S"} with --service, else {})',
    )
    remote.add_argument(
        "--since",
        type=parse_since,
        metavar="DURATION",
        default=None,
        help=f"how far back to look: 30m, 1h, 2d, 1h30m ... (default {DEFAULT_SINCE}; an embedded"
             " --clickhouse chdb: database is read in full without it)",
    )
    from otel_stages.commands.import_otlp import add_clickhouse_arguments

    add_clickhouse_arguments(remote, required=False)
    remote.add_argument(
        "--limit",
        type=int_at_least(1),
        metavar="N",
        default=None,
        help=f"read at most N traces, the most recent (default {DEFAULT_LIMIT})",
    )
    add_mapping_arguments(parser)


def _usage_problem(args: argparse.Namespace) -> str | None:
    """Why these arguments do not go together, or ``None``."""
    traces = args.jaeger or args.tempo
    if args.jaeger and args.tempo:
        return "give one trace source: --jaeger or --tempo"
    if args.paths and (traces or args.prometheus):
        return (
            "give trace files/folders (PATH) or a remote source (--jaeger, --tempo,"
            " --prometheus), not both"
        )
    if args.jaeger and not args.service:
        return "--jaeger needs --service (Jaeger searches traces by service)"
    if args.query is not None and not args.tempo:
        return "--query is a TraceQL query for --tempo"
    if args.limit is not None and not traces:
        return "--limit goes with --jaeger or --tempo"
    if args.traces_table != DEFAULT_TRACES_TABLE or args.gauge_table != DEFAULT_GAUGE_TABLE:
        return "--traces-table and --gauge-table go with --clickhouse"
    if not (traces or args.prometheus) and args.since is not None:
        return "--since goes with --jaeger, --tempo, --prometheus or --clickhouse"
    if args.html and args.prometheus and not traces:
        return "--html draws traces: use it with PATHs, --jaeger or --tempo"
    if args.prometheus and not traces and args.baseline:
        return "--baseline compares traces: use it with PATHs, --jaeger or --tempo"
    if args.fail_on_regression is not None and not args.baseline:
        return "--fail-on-regression compares with a baseline: give --baseline PATH"
    if args.prometheus and not traces and args.last_run:
        return "--last-run picks a process from traces: use it with PATHs, --jaeger or --tempo"
    if [*args.paths, *(args.baseline or [])].count(STDIN) > 1:
        return "stdin (-) can be read only once"
    mapping = _mapping_usage_problem(args, traces=bool(traces))
    if mapping:
        return mapping
    missing = [p for p in [*args.paths, *(args.baseline or [])] if p != STDIN and not os.path.exists(p)]
    if missing:  # a typo must not pass a CI run with a report of the other files
        return f"no such file or folder: {', '.join(missing)}"
    return None


def _load(paths: list[str], selection: Selection, *, show: bool = False,
          what: str = "traces") -> Recording:
    """Files and folders, plus standard input for ``-`` (named ``<stdin>`` in problems), keeping
    the span attributes ``selection`` names. With ``show`` (a person watches a terminal), a
    progress bar in bytes read, labelled with the file being read; its total counts every file
    found, folders included (standard input is not counted)."""
    from otel_stages.progress import progress

    files = [p for p in paths if p != STDIN]
    with progress(f"reading {what}", None, enabled=show and bool(files), unit="bytes") as bar:
        def on_file(path: str, size: int) -> None:
            bar.describe(f"reading {what}: {os.path.basename(path)}")

        recording = load_paths(files, selection=selection, progress=bar, on_file=on_file)
    if STDIN in paths:
        stream = getattr(sys.stdin, "buffer", None)
        if stream is not None:
            recording.extend(load_stream(stream, "<stdin>", selection=selection))
        else:
            recording.extend(load_bytes(sys.stdin.read().encode("utf-8"), "<stdin>", selection=selection))
    return recording


def run(args: argparse.Namespace) -> int:
    """Load, diagnose, print. Returns the exit status (see the module docstring)."""
    with stage_map_order(args):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.clickhouse:
        from otel_stages.commands import clickhouse_report

        problem = clickhouse_report.usage_problem(args)
        if problem:
            print(f"otel-stages report: error: {problem}", file=sys.stderr)
            return 2
        return clickhouse_report.run(args, parse_since(DEFAULT_SINCE))
    problem = _usage_problem(args)
    if problem:
        print(f"otel-stages report: error: {problem}", file=sys.stderr)
        return 2
    if args.html:
        problem = _html_problem(args.html)
        if problem:
            print(f"otel-stages report: error: {problem}", file=sys.stderr)
            return 1
    remote = bool(args.jaeger or args.tempo)
    if args.prometheus and not remote:
        return run_prometheus(args)
    try:  # before any reading: a bad map fails fast, and the map says which attributes to keep
        selection = report_selection(args)
    except StageMapError as exc:
        print(f"otel-stages report: error: --stage-map: {exc}", file=sys.stderr)
        return 2
    if remote:
        try:
            recording, where = load_remote(args, time.time_ns())
        except SourceError as exc:
            print(f"otel-stages: error: {exc}", file=sys.stderr)
            return 1
    else:
        paths = list(args.paths) or [default_data_dir()]
        recording = _load(paths, selection, show=show_progress(args.json))
        where = ", ".join("stdin" if p == STDIN else p for p in paths)
    baseline = (_load(args.baseline, selection, show=show_progress(args.json), what="baseline")
                if args.baseline else None)
    no_service = ""  # what the "no requests found" error adds when --service found no request
    if args.service:  # (Jaeger and Tempo return whole traces: their other services' requests go)
        picked = pick_service(recording, args.service)
        if not any(service_of(s.resource) == args.service for s in picked.spans):
            hosts = service_hosts(recording, args.service)
            if hosts:
                no_service = f": {no_request_line(args.service, hosts)}"
            elif not picked.spans:
                seen = spans_by_service(recording.spans)
                no_service = f": {no_service_line(args.service, seen, len(seen))}"
        recording = picked
        baseline = None if baseline is None else pick_service(baseline, args.service)
    try:
        recording, baseline, mapped = apply_stage_map_argument(args, recording, baseline)
    except StageMapError as exc:
        print(f"otel-stages report: error: --stage-map: {exc}", file=sys.stderr)
        return 2
    if baseline is not None and not find_requests(baseline.spans):
        warn([f"baseline: {p}" for p in baseline.problems])
        print(
            f"otel-stages: error: no requests found in the baseline ({', '.join(args.baseline)}):"
            " nothing to compare with",
            file=sys.stderr,
        )
        return 1
    report = diagnose(recording, baseline=baseline, top=args.top, last_run=args.last_run)
    if mapped is not None:  # advice a server's user can follow, not stage() spans
        mapped.advise(report.verdict)
    warn(report.problems)
    if args.json:
        out = report.to_dict()
        if remote:
            out = {"source": "jaeger" if args.jaeger else "tempo", **out}
        if mapped is not None:
            out["stage_map"] = mapped.to_dict()
        print(json.dumps(out, indent=2))
    elif report.requests:
        from otel_stages.render import render  # rich only when text is wanted

        render(report, sys.stdout)
        if mapped is not None and mapped.label_lines():
            print("\n".join(mapped.label_lines()))
    if args.html and report.requests and _write_html(args, recording, baseline, report, where):
        return 1
    if report.requests == 0:
        hint = (
            " (record some first with `otel-stages demo`, or pass trace files/folders)"
            if not args.paths and not remote
            else ""
        ) + stage_map_hint(args, recording)
        print(f"otel-stages: error: no requests found in {where}{no_service}{hint}", file=sys.stderr)
        return 1
    if args.fail_on_regression is not None and report.comparison is not None:
        # a regression found (a failure-rate rise can be judged with too few warm requests) trips
        # the gate before "cannot judge" does
        regressions = report.comparison.regressions(args.fail_on_regression)
        for line in regressions:
            print(f"otel-stages: regression: {line}", file=sys.stderr)
        if regressions and report.comparison.uniform_shift:
            print("otel-stages: note: every stage slowed together, which often means a busier or"
                  " throttled host rather than the change", file=sys.stderr)
        if regressions and report.comparison.inputs_differ:
            distance = report.comparison.input_distance or 0.0
            print(f"otel-stages: note: the two runs' inputs differ (cohort mix {distance:.0%} apart):"
                  " the change may come from the inputs, not the code; gate on runs of the same"
                  " inputs", file=sys.stderr)
        if regressions:
            return EXIT_REGRESSION
        undecided = report.comparison.undecided(args.fail_on_regression)
        if undecided is not None:
            print(f"otel-stages: error: --fail-on-regression cannot judge: {undecided}; record"
                  " more requests on both sides", file=sys.stderr)
            return EXIT_UNTESTED
        if not report.comparison.tested:
            total = report.comparison.total
            print(f"otel-stages: error: --fail-on-regression cannot judge: too few warm requests"
                  f" ({total.baseline_count} before, {total.count} after; at least {MIN_SAMPLES}"
                  " a side); record more requests", file=sys.stderr)
            return EXIT_UNTESTED
    return 0


# --- issue 8: other servers' traces (--stage-map) and Prometheus naming overrides -------------------
# Kept apart from the rest of the command on purpose: four small hooks above call into this block.


def add_mapping_arguments(parser: argparse.ArgumentParser) -> None:
    """``--stage-map`` and the ``--prometheus`` naming overrides."""
    from otel_stages.analysis.stage_map import BUILTIN

    group = parser.add_argument_group("other servers and metric names")
    group.add_argument(
        "--stage-map",
        metavar="MAP",
        help=f"map another server's spans to stages before the diagnosis: {' or '.join(BUILTIN)}"
        " (built in), or a YAML/JSON map file",
    )
    group.add_argument(
        "--metric",
        metavar="NAME",
        help="--prometheus: the span-duration histogram (default: found among the known namings)",
    )
    group.add_argument("--span-label", metavar="LABEL", help="--prometheus: label holding the span name")
    group.add_argument(
        "--service-label", metavar="LABEL", help="--prometheus: label holding service.name"
    )
    group.add_argument(
        "--metric-unit",
        choices=("ms", "s"),
        help="--prometheus: unit of the histogram when its name does not say",
    )


def _mapping_usage_problem(args: argparse.Namespace, *, traces: bool) -> str | None:
    naming = [f for f in ("metric", "span_label", "service_label", "metric_unit") if getattr(args, f)]
    if naming and not (args.prometheus and not traces):
        return f"--{naming[0].replace('_', '-')} goes with --prometheus (the fleet-wide report)"
    if args.stage_map and args.prometheus and not traces:
        return "--stage-map maps spans: use it with PATHs, --jaeger or --tempo"
    return None


def report_selection(args: argparse.Namespace) -> Selection:
    """The span attributes the report keeps from files: what the analysis reads, plus the
    attributes ``--stage-map`` turns into stages. Raises :class:`StageMapError`."""
    from otel_stages.analysis.selection import for_analysis

    if not args.stage_map:
        return for_analysis()
    from otel_stages.analysis.stage_map import load_stage_map

    return for_analysis(load_stage_map(args.stage_map).attribute_keys())


@contextmanager
def stage_map_order(args: argparse.Namespace) -> Iterator[None]:
    """With ``--stage-map``, the report's tables list the map's stages in the map's order
    (:func:`otel_stages.analysis.stats.pipeline_order`). A map that does not load changes
    nothing here: the run reports that error itself."""
    from otel_stages.analysis.stats import pipeline_order

    order: tuple[str, ...] = ()
    if args.stage_map and not args.clickhouse:
        from otel_stages.analysis.stage_map import load_stage_map

        try:
            order = load_stage_map(args.stage_map).stage_order()
        except StageMapError:
            pass
    with pipeline_order(order):
        yield


def stage_map_hint(args: argparse.Namespace, recording: Recording) -> str:
    """Without ``--stage-map``, where the spans carry a built-in map's request span name: the
    sentence suggesting that map (appended to "no requests found"); else ``""``."""
    if args.stage_map:
        return ""
    from otel_stages.analysis.stage_map import load_stage_map, suggest_stage_map

    name = suggest_stage_map(recording.spans)
    if name is None:
        return ""
    spans = " or ".join(sorted(load_stage_map(name).request))
    return (f"; the {spans} spans look like {name}'s own traces: map them to stages with"
            f" --stage-map {name}")


def apply_stage_map_argument(
    args: argparse.Namespace, recording: Recording, baseline: Recording | None
) -> tuple[Recording, Recording | None, MapSummary | None]:
    """Apply ``--stage-map`` to the recording (and baseline). Raises :class:`StageMapError`."""
    if not args.stage_map:
        return recording, baseline, None
    from otel_stages.analysis.stage_map import apply_stage_map, load_stage_map

    stage_map = load_stage_map(args.stage_map)
    recording, summary = apply_stage_map(stage_map, recording)
    if baseline is not None:
        baseline, _ = apply_stage_map(stage_map, baseline)
    return recording, baseline, summary
# --- --html (the HTML rendering lives in otel_stages.html_report; this only wires it) ---------


def _html_problem(path: str) -> str | None:
    """Why ``--html FILE`` cannot work (no Bokeh, no such folder), checked before any loading."""
    import importlib.util

    from otel_stages.html_report import INSTALL_HINT

    if importlib.util.find_spec("bokeh") is None:
        return INSTALL_HINT
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"--html {path}: folder {folder} does not exist"
    if os.path.isdir(path):
        return f"--html {path}: is a folder; give a file name such as report.html"
    return None


def _write_html(
    args: argparse.Namespace, recording: Recording, baseline: Recording | None, report: Report,
    where: str,
) -> bool:
    """Write the HTML report for ``report``; True when it failed (the message is on stderr)."""
    from otel_stages.analysis.charts import report_charts
    from otel_stages.html_report import SECTION_COUNT, write_html
    from otel_stages.progress import progress

    charts = report_charts(recording, baseline=baseline, report=report,
                           title=f"otel-stages report: {where}")
    with progress("writing HTML report", SECTION_COUNT, enabled=show_progress(args.json),
                  unit="sections") as bar:
        try:
            write_html(charts, args.html, tick=bar.advance)
        except OSError as exc:
            print(f"otel-stages: error: cannot write {args.html}: {exc.strerror or exc}",
                  file=sys.stderr)
            return True
    print(f"otel-stages: HTML report written to {args.html}", file=sys.stderr)
    return False
