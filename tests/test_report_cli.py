"""``otel-stages report`` as a user meets it: the text layout at terminal widths, trace ids,
--baseline parsing and checks, stdin, --version and -v placement."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.change import Change
from otel_stages.analysis.units import duration, ms, pct, signed_ms, signed_pct
from otel_stages.cli import build_parser, main
from otel_stages.render import render, render_text

CASES = Path(__file__).parent / "data" / "traces"
NAMES = sorted(p.name.split(".")[0] for p in CASES.glob("*.otlp.jsonl"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _report(name: str, baseline: str | None = "stable"):
    return diagnose(
        load_paths([CASES / f"{name}.otlp.jsonl"]),
        baseline=load_paths([CASES / f"{baseline}.otlp.jsonl"]) if baseline else None,
    )


# --- layout ----------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [60, 80, 100])
@pytest.mark.parametrize("name", NAMES)
def test_numbers_names_and_trace_ids_are_never_cut(name, width):
    report = _report(name)
    out = render_text(report, width=width)
    lines = out.splitlines()
    assert "…" not in out
    assert max(len(line) for line in lines) <= width
    cells = " ".join(lines)
    for stage in report.stages.values():
        assert re.search(rf"\b{stage.name}\b", cells)
        assert ms(stage.median_ms) in cells and ms(stage.swing_ms) in cells
    for slow in report.slowest:
        assert len(slow.trace_id) == 32
        assert slow.trace_id in out  # the full id, pasted into Jaeger / Tempo
        assert ms(slow.total_ms) in out


def test_narrow_terminal_says_which_columns_it_left_out():
    out = render_text(_report("gpu_busy", None), width=60)
    assert "too narrow: min, max not shown" in out
    assert "median" in out and "swing" in out
    assert "trace ids:" in out
    wide = render_text(_report("gpu_busy", None), width=160)  # every stage has a column
    assert "too narrow" not in wide and "trace ids:" not in wide
    assert re.search(r"\bmin\b.*\bmax\b", wide)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns", [60, 80])
def test_a_terminal_of_columns_width_gets_a_fitted_report(columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    terminal = _Terminal()
    report = _report("preprocess_mixed_sizes")
    render(report, terminal)
    text = ANSI.sub("", terminal.getvalue())
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= columns
    assert all(s.trace_id in text for s in report.slowest)


def test_a_long_custom_stage_name_folds_instead_of_being_cut():
    report = _report("stable", None)
    stats = report.stages.pop("forward")
    long_name = "tokenize_and_build_prompt_template"
    report.stages[long_name] = stats.__class__(**{**stats.__dict__, "name": long_name})
    out = render_text(report, width=60)
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 60
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(" stage "))
    first_column = "".join(line.split()[0] for line in lines[head + 2:head + 9])
    assert long_name in first_column


# --- cosmetics -------------------------------------------------------------------------------


def test_zero_changes_and_noise_have_no_minus_sign():
    assert signed_ms(-0.0001) == "0.0" and signed_ms(-0.04) == "-0.040"
    assert signed_ms(12.34) == "+12.3" and signed_ms(-160.0) == "-160.0"
    assert signed_pct(-0.4) == "0%" and signed_pct(-57.3) == "-57%" and signed_pct(3) == "+3%"
    assert pct(-0.01) == "0%" and pct(-0.004) == "0%" and pct(-0.3) == "-30%" and pct(0.56) == "56%"
    assert Change(3.0, 3.0 - 1e-5).describe() == "3.0 ms -> 3.0 ms (0.0 ms, 0%)"
    assert ms(0.999) == "1.0" and ms(0.42) == "0.42" and ms(0.042) == "0.042" and ms(0) == "0.0"
    assert duration(0.0421) == "42 µs" and duration(0.0042) == "4.2 µs" and duration(12.34) == "12.3 ms"


def test_comparison_text_shows_no_negative_zero():
    out = render_text(_report("preprocess_mixed_sizes"), width=100)  # vs stable.otlp.jsonl
    assert "Compared with the baseline" in out
    assert not re.search(r"-0\.0\b|-0%", out)


# --- CLI -------------------------------------------------------------------------------------


def test_missing_or_empty_baseline_fails_clearly(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    stable = str(CASES / "stable.otlp.jsonl")
    assert main(["report", stable, "--baseline", str(empty)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"no requests found in the baseline ({empty})" in captured.err
    missing = str(tmp_path / "nope")  # a path that is not there: a usage error, nothing read
    assert main(["report", stable, "--baseline", missing]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"no such file or folder: {missing}" in captured.err


def test_baseline_takes_one_path_so_paths_may_follow_it(capsys):
    before, after = CASES / "preprocess_mixed_sizes.otlp.jsonl", CASES / "queue_batching.otlp.jsonl"
    assert main(["report", "--baseline", str(before), str(after), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"]["cause"] == "queue"  # after.jsonl is the report, not a baseline
    assert out["comparison"]["baseline_verdict"]["cause"] == "preprocess"
    # repeatable: two baselines, the same recording twice reads once
    argv = ["report", str(after), "--baseline", str(before), "--baseline", str(before), "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["comparison"]["baseline_requests"] == 30


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_dash_reads_stdin(monkeypatch, capsys):
    _stdin(monkeypatch, b"\xef\xbb\xbf" + (CASES / "gpu_busy.otlp.jsonl").read_bytes())
    assert main(["report", "-", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 30 and out["verdict"]["cause"] == "gpu_busy" and out["problems"] == []
    _stdin(monkeypatch, b"{oops\n")
    assert main(["report", "-"]) == 1
    assert "<stdin>:1: not valid JSON" in capsys.readouterr().err
    assert main(["report", "-", "--baseline", "-"]) == 2
    assert "stdin (-) can be read only once" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert re.fullmatch(r"otel-stages \d+\.\d+\S*\n", capsys.readouterr().out)


@pytest.mark.parametrize(
    "argv, verbose",
    [(["report"], False), (["-v", "report"], True), (["report", "-v"], True),
     (["report", "--verbose", "x.jsonl"], True), (["-v", "gpu", "-v"], True)],
)
def test_verbose_before_or_after_the_subcommand(argv, verbose):
    assert build_parser().parse_args(argv).verbose is verbose


# --- runs, --last-run and the text sections ----------------------------------------------------


def test_runs_are_listed_and_last_run_keeps_the_newest(tmp_path, capsys):
    from msgspec.structs import replace

    from otel_stages.analysis import Recording

    older = load_paths([CASES / "queue_batching.otlp.jsonl"])
    newer = load_paths([CASES / "stable.otlp.jsonl"])
    shift = max(s.end_ns for s in older.spans) + 60 * 10**9 - min(s.start_ns for s in newer.spans)
    moved = [replace(s, start_ns=s.start_ns + shift, end_ns=s.end_ns + shift,
                     resource={**s.resource, "service.instance.id": "newer"})
             for s in newer.spans]
    both = Recording(spans=older.spans + moved)
    everything = diagnose(both)
    assert [r.service_instance_id for r in everything.runs][-1] == "newer"
    assert [r.requests for r in everything.runs] == [30, 30]
    newest = diagnose(both, last_run=True)
    assert newest.requests == 30 and newest.verdict.cause == "stable"
    assert [r.reported for r in newest.runs] == [False, True]
    out = newest.to_dict()
    assert [r["reported"] for r in out["runs"]] == [False, True]
    text = render_text(newest)
    assert "Newest of 2 runs read (--last-run; 1 older not reported):" in text
    assert "instance newer: 30 requests" in text
    assert "2 runs read:" in render_text(everything)


def test_last_run_with_prometheus_alone_is_a_usage_error(capsys):
    assert main(["report", "--prometheus", "http://127.0.0.1:1", "--last-run"]) == 2
    assert "--last-run picks a process from traces" in capsys.readouterr().err


def test_text_has_the_unaccounted_row_cohorts_and_a_tentative_mark():
    mixed = render_text(_report("preprocess_mixed_sizes", None), width=100)
    assert "(unaccounted)" in mixed and "Input cohorts (2;" in mixed
    assert "320x240" in mixed and "? = tentative" in mixed
    from tests.test_verdict import build, steady

    few = render_text(diagnose(build(steady(12, forward=lambda i, r: 100.0 if i % 3 else 600.0))))
    assert "Verdict: forward (stage: forward) - tentative" in few
    assert "run the same input 9 more times" in few
