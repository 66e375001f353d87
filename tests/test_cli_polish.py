"""Issue 12 item 5: progress on long work (loading files, remote traces) only where a person
watches a terminal, colour that degrades cleanly, and units in every ``--help``.

The terminals here are ``io.StringIO`` objects that say they are TTYs (rich then draws as on a
terminal); the remote source is a real local HTTP server answering with recorded Jaeger and Tempo
responses (tests/test_report_sources.py).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from otel_stages.analysis import load_paths
from otel_stages.analysis.jaeger import fetch_jaeger
from otel_stages.analysis.tempo import fetch_tempo
from otel_stages.cli import COMMANDS, main
from otel_stages.progress import progress, show_progress
from tests.test_report_sources import make_server, serve_jaeger, serve_tempo  # noqa: F401

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
T_START, T_END = 0, 4_000_000_000 * 10**9


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in ("NO_COLOR", "FORCE_COLOR", "COLORTERM", "TERM", "COLUMNS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "120")
    return monkeypatch


# --- the loader's per-file callback --------------------------------------------------------------


def test_load_paths_reports_each_file_before_reading_it(tmp_path: Path) -> None:
    a, b = TRACES / "stable.otlp.jsonl", TRACES / "cold_start.otlp.jsonl"
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "x.jsonl").write_bytes(a.read_bytes())
    calls: list[tuple[str, int]] = []
    rec = load_paths([a, folder, b, a], on_file=lambda p, n: calls.append((p, n)))
    assert calls == [(str(a), a.stat().st_size), (str(folder / "x.jsonl"), a.stat().st_size),
                     (str(b), b.stat().st_size)]  # a file reached twice is read (and named) once
    assert rec.spans and load_paths([a, folder, b]).spans == rec.spans


# --- progress: only for a person at a terminal ---------------------------------------------------


def test_show_progress_is_off_for_json_and_piped_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout", Terminal())
    assert show_progress(False) is True
    assert show_progress(True) is False  # --json
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert show_progress(False) is False  # otel-stages report | less, > file


def test_a_dumb_terminal_gets_no_bar(terminal_env: pytest.MonkeyPatch) -> None:
    tty = Terminal()
    with progress("work", 3, stream=tty) as bar:
        bar.advance(3)
    assert "work" in tty.getvalue()
    terminal_env.setenv("TERM", "dumb")  # cannot move the cursor: a bar would print line by line
    dumb = Terminal()
    with progress("work", 3, stream=dumb) as bar:
        bar.advance(3)
    assert dumb.getvalue() == ""


def test_a_bytes_bar_counts_in_kb_and_mb(terminal_env: pytest.MonkeyPatch) -> None:
    tty = Terminal()
    with progress("reading traces", 3_000_000, stream=tty, unit="bytes") as bar:
        bar.describe("reading traces: a.jsonl")
        bar.advance(1_500_000)
    text = ANSI.sub("", tty.getvalue())
    assert "reading traces: a.jsonl" in text and "MB" in text


def _report_on_terminals(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[int, str, str]:
    out, err = Terminal(), Terminal()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    code = main(["report", *argv])
    return code, out.getvalue(), err.getvalue()


def test_report_shows_file_progress_on_a_terminal_only(terminal_env: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = str(TRACES / "stable.otlp.jsonl")
    code, out, err = _report_on_terminals(terminal_env, [path])
    assert code == 0 and "Verdict" in ANSI.sub("", out)
    assert "reading traces" in ANSI.sub("", err)  # the bar, on stderr only
    assert "reading traces" not in ANSI.sub("", out)
    code, out, err = _report_on_terminals(terminal_env, [path, "--json"])
    assert code == 0 and out.lstrip().startswith("{") and err == ""
    # piped stdout (a script): no bar even though stderr is a terminal
    err_tty = Terminal()
    terminal_env.setattr("sys.stderr", err_tty)
    terminal_env.setattr("sys.stdout", io.StringIO())
    assert main(["report", path]) == 0
    assert err_tty.getvalue() == ""


@pytest.mark.parametrize("source", ["jaeger", "tempo"])
def test_remote_reads_report_each_trace(source: str, make_server) -> None:  # noqa: F811
    server = make_server()
    cassette = (serve_jaeger if source == "jaeger" else serve_tempo)(server, "gpu_busy")
    calls: list[tuple[int, int]] = []
    if source == "jaeger":
        rec = fetch_jaeger(server.url, "vlm-server", start_ns=T_START, end_ns=T_END,
                           on_trace=lambda d, t: calls.append((d, t)))
    else:
        rec = fetch_tempo(server.url, "{}", start_ns=T_START, end_ns=T_END,
                          on_trace=lambda d, t: calls.append((d, t)))
    n = len(cassette["traces"])
    assert rec.spans and calls == [(i, n) for i in range(1, n + 1)]


def test_report_shows_remote_progress_on_a_terminal(terminal_env: pytest.MonkeyPatch,
                                                    make_server) -> None:  # noqa: F811
    server = make_server()
    serve_jaeger(server, "gpu_busy")
    code, _, err = _report_on_terminals(
        terminal_env, ["--jaeger", server.url, "--service", "vlm-server"])
    assert code == 0 and "reading traces from Jaeger" in ANSI.sub("", err)


# --- colour degrades cleanly ---------------------------------------------------------------------


#: A foreground colour (NO_COLOR allows bold and other non-colour styles: no-color.org).
COLOUR = re.compile(r"\x1b\[[0-9;]*3[0-9]m")


@pytest.mark.parametrize(("env", "coloured"), [({}, True), ({"NO_COLOR": "1"}, False),
                                               ({"TERM": "dumb"}, False)])
def test_text_report_colour_follows_no_color_and_term(env: dict[str, str], coloured: bool,
                                                      terminal_env: pytest.MonkeyPatch) -> None:
    from otel_stages.analysis import diagnose
    from otel_stages.render import render

    for key, value in env.items():
        terminal_env.setenv(key, value)
    report = diagnose(load_paths([TRACES / "gpu_busy.otlp.jsonl"]))
    tty = Terminal()
    render(report, tty)
    text = tty.getvalue()
    assert "Verdict" in ANSI.sub("", text)
    assert bool(COLOUR.search(text)) is coloured
    piped = io.StringIO()  # not a terminal: never an escape code, whatever the environment
    render(report, piped)
    assert "\x1b" not in piped.getvalue()


# --- units in every --help -----------------------------------------------------------------------


def _help(command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at the terminal width, even inside words
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


#: What each command's help must say about units (of its options and of what it prints).
UNITS = {
    "report": ["milliseconds (ms)", "percent of all request time", "pixels", "bytes",
               "30m, 1h, 2d", "PCT percent", "_ms, _ns, _s, _bytes"],
    "demo": ["MS", "milliseconds", "pixel", "12 MP"],
    "gpu": ["seconds between refreshes", "_bytes, _w, _c", "0..1"],
    "decode-bench": ["milliseconds", "in pixels, width x height"],
    "collector-config": [],
    "import": [],  # no numeric option: files, a URL and table names
}


def test_every_command_is_covered() -> None:
    assert set(UNITS) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(UNITS))
def test_help_gives_units(command: str, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(command, monkeypatch, capsys)
    for phrase in UNITS[command]:
        assert phrase in text, (command, phrase)


def test_demo_help_names_the_demo_s_real_sizes(monkeypatch, capsys) -> None:
    from otel_stages.demo.images import FIXED_SIZE, PHOTO_SIZE, THUMB_SIZE
    from otel_stages.demo.model import EncoderConfig

    text = _help("demo", monkeypatch, capsys)
    side = EncoderConfig().image_size
    for w, h in (FIXED_SIZE, THUMB_SIZE, PHOTO_SIZE, (side, side)):
        assert f"{w}x{h}" in text


# --- the slowest-requests table shows every stage (item 4 of the list) ---------------------


def _slowest_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "slowest warm requests" in line)
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip())
    return lines[start:end]


def test_slowest_table_has_every_stage_and_the_unaccounted_time() -> None:
    from otel_stages.analysis import diagnose
    from otel_stages.render import render_text

    report = diagnose(load_paths([TRACES / "queue_batching.otlp.jsonl"]))
    block = _slowest_block(render_text(report, width=160))
    header = block[1].split()
    assert header == ["seq", "total", "image", "bytes", *report.stages, "unaccounted", "trace", "id"]
    slowest = report.slowest[0]
    row = next(line for line in block if slowest.trace_id in line)
    for name in report.stages:  # the numbers of every stage, uncut
        assert f"{slowest.stages_ms[name]:.1f}" in row or f"{slowest.stages_ms[name]:.2f}" in row


def test_a_narrow_slowest_table_drops_the_smallest_stages_first_never_the_verdict_s() -> None:
    from otel_stages.analysis import diagnose
    from otel_stages.render import render_text

    report = diagnose(load_paths([TRACES / "queue_batching.otlp.jsonl"]))
    assert report.verdict.stage == "queue"
    block = _slowest_block(render_text(report, width=60))
    header = next(line for line in block if line.strip().startswith("seq")).split()
    assert "queue" in header and "total" in header
    text = " ".join(render_text(report, width=60).split())
    after = text[text.index("slowest warm requests"):]
    note = after[after.index("(too narrow"):].split(")")[0]
    shown = [n for n in report.stages if n in header]
    left_out = [n for n in report.stages if n not in header]
    assert left_out and all(n in note for n in left_out)
    # every stage left out has a smaller share than every other stage shown (the verdict's aside)
    for gone in left_out:
        assert all(report.stages[gone].share <= report.stages[kept].share
                   for kept in shown if kept != report.verdict.stage)
