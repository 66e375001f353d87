"""``otel-stages decode-bench``: the table's rules (pure, with named thresholds), the measuring
on real images through Pillow (tests/data/images and a 12 MP JPEG made here), JPEG draft decoding
in ``imaging.decode``, the CLI, and the progress helper.

No timed assertion: runs are counted and shapes checked; the speed-up figures live in the
command's output and in the report of the issue.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from otel_stages import imaging, semconv
from otel_stages.analysis import decode_table as dt
from otel_stages.analysis.decode_table import DecodeTimings, is_unstable, row, summarize
from otel_stages.analysis.evidence import FOLLOWS_SIZE_MIN_R
from otel_stages.cli import main
from otel_stages.decode_bench import measure, runs_per_image
from otel_stages.demo.images import jpeg_photo
from otel_stages.progress import progress
from otel_stages.terminal import is_terminal

IMAGES = Path(__file__).parent / "data" / "images"


@pytest.fixture(scope="module")
def photo_12mp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4000x3000 (12 MP) photo-like JPEG, as a phone writes it (4:2:0, quality 90)."""
    path = tmp_path_factory.mktemp("bench") / "photo_12mp.jpg"
    path.write_bytes(jpeg_photo((4000, 3000), seed=7))
    return path


# --- the stability rule ---------------------------------------------------------------------------


def _runs(median: float, swing: float, n: int = 20) -> list[float]:
    """``n`` values with the given median whose p95 - p5 is exactly ``swing`` (evenly spread)."""
    step = swing / ((n - 1) * 0.90)  # p95 - p5 of an even spread over n values = 0.9 * range
    return [median + (i - (n - 1) / 2) * step for i in range(n)]


def test_runs_helper_gives_the_asked_swing() -> None:
    values = _runs(10.0, 5.0)
    swing = dt.percentile(values, 95) - dt.percentile(values, 5)
    assert swing == pytest.approx(5.0)


@pytest.mark.parametrize(("fraction", "unstable"), [(0.49, False), (0.51, True)])
def test_unstable_at_half_the_median(fraction: float, unstable: bool) -> None:
    assert dt.UNSTABLE_MIN_SWING_FRACTION == 0.5
    assert is_unstable(_runs(100.0, fraction * 100.0)) is unstable


@pytest.mark.parametrize(("swing_ms", "unstable"), [(0.95, False), (1.05, True)])
def test_sub_millisecond_swings_are_noise(swing_ms: float, unstable: bool) -> None:
    assert dt.UNSTABLE_MIN_SWING_MS == 1.0
    assert is_unstable(_runs(1.0, swing_ms)) is unstable  # the fraction is far above 0.5 either way


def test_too_few_runs_are_not_judged() -> None:
    wild = [1.0, 100.0, 1.0, 100.0]
    assert len(wild) < dt.MIN_RUNS_FOR_STABILITY
    assert is_unstable(wild) is None
    assert is_unstable([*wild, 1.0]) is True


# --- rows and findings --------------------------------------------------------------------------------


def _timings(name: str, w: int, h: int, size: int, median_ms: float, **kw) -> DecodeTimings:
    base = {"first_decode_ms": median_ms * 2, "decode_ms": tuple(_runs(median_ms, 0.0, 10)),
            "resize_ms": (1.0,) * 10, "decode_resize_ms": (median_ms + 1,) * 10}
    base.update(kw)
    return DecodeTimings(name=name, size_bytes=size, width=w, height=h, format="JPEG",
                         target=(224, 224), **base)


def test_row_summarizes_min_median_max_and_the_draft_speedup() -> None:
    t = _timings("a.jpg", 4000, 3000, 2_000_000, 100.0, decode_ms=(90.0, 100.0, 130.0, 95.0, 105.0),
                 decode_resize_ms=(150.0, 160.0, 170.0), draft_decode_resize_ms=(50.0, 40.0, 60.0),
                 draft_scale=8)
    r = row(t)
    assert (r.decode_min_ms, r.decode_median_ms, r.decode_max_ms) == (90.0, 100.0, 130.0)
    assert r.first_decode_ms == 200.0
    assert r.draft_speedup == pytest.approx(160.0 / 50.0)
    assert r.ms_per_megapixel == pytest.approx(100.0 / 12.0)
    assert r.to_dict()["draft_speedup"] == 3.2


def test_no_speedup_is_claimed_when_draft_cannot_reduce() -> None:
    t = _timings("small.jpg", 320, 240, 30_000, 1.0, decode_resize_ms=(2.0,) * 5,
                 draft_decode_resize_ms=(1.0,) * 5, draft_scale=1)
    assert row(t).draft_speedup is None  # scale 1 decodes the full image: 2x would be noise


def test_cost_follows_pixels_over_three_sizes() -> None:
    bench = summarize([_timings("s", 640, 480, 50_000, 5.0), _timings("m", 1920, 1080, 900_000, 30.0),
                       _timings("l", 4000, 3000, 1_000_000, 180.0)], repeat=10, target=(224, 224))
    assert bench.follows["pixels"] is not None and bench.follows["pixels"] >= FOLLOWS_SIZE_MIN_R
    assert any(f.startswith("decode cost follows image pixels") for f in bench.findings)


def test_cost_that_does_not_follow_size_is_said_so() -> None:
    bench = summarize([_timings("s", 640, 480, 50_000, 50.0), _timings("m", 1920, 1080, 900_000, 5.0),
                       _timings("l", 4000, 3000, 1_000_000, 40.0)], repeat=10, target=(224, 224))
    assert any(f.startswith("decode cost does not follow image") for f in bench.findings)


def test_two_images_are_not_enough_to_say_whether_cost_follows_size() -> None:
    bench = summarize([_timings("s", 640, 480, 50_000, 5.0), _timings("l", 4000, 3000, 10**6, 180.0)],
                      repeat=10, target=(224, 224))
    assert bench.follows == {"pixels": None, "bytes": None}
    assert any("needs 3+ images" in f for f in bench.findings)


def test_unstable_image_is_named_in_the_findings() -> None:
    steady = _timings("steady.jpg", 640, 480, 50_000, 10.0)
    shaky = _timings("shaky.jpg", 640, 480, 50_000, 10.0, decode_ms=tuple(_runs(10.0, 8.0, 10)))
    bench = summarize([steady, shaky], repeat=11, target=(224, 224))
    unstable = [f for f in bench.findings if "unstable" in f]
    assert len(unstable) == 1 and unstable[0].startswith("shaky.jpg")


# --- measuring real images ---------------------------------------------------------------------------


def test_12mp_jpeg_is_measured_with_draft_decoding_at_one_eighth(photo_12mp: Path) -> None:
    ticks: list[int] = []
    t = measure(photo_12mp.name, photo_12mp.read_bytes(), repeat=3, target=(224, 224),
                tick=lambda: ticks.append(1))
    assert (t.width, t.height, t.format) == (4000, 3000, "JPEG")
    assert t.error is None and t.first_decode_ms and t.first_decode_ms > 0
    assert len(t.decode_ms) == 2  # the first run is apart
    assert len(t.decode_resize_ms) == len(t.draft_decode_resize_ms) == len(t.resize_ms) == 3
    assert t.draft_scale == 8  # 4000 // 224 = 17 >= 8: libjpeg's smallest scale
    assert len(ticks) == runs_per_image(3)
    assert row(t).draft_speedup is not None


@pytest.mark.parametrize(("name", "fmt", "draft"), [
    ("photo_1920x1080.jpg", "JPEG", 4),   # 1920 // 224 = 8, 1080 // 224 = 4: the smaller side decides
    ("cmyk_640x480.jpg", "JPEG", 2),
    ("rgba_800x600.png", "PNG", None),   # no draft mode for PNG: measured without it
])
def test_real_images_of_each_kind(name: str, fmt: str, draft: int | None) -> None:
    t = measure(name, (IMAGES / name).read_bytes(), repeat=2, target=(224, 224))
    assert t.error is None and t.format == fmt and t.draft_scale == draft
    assert bool(t.draft_decode_resize_ms) is (draft is not None)


@pytest.mark.parametrize("name", ["truncated.jpg", "empty.jpg", "html_error_page.jpg"])
def test_images_that_do_not_decode_give_an_error_row(name: str) -> None:
    t = measure(name, (IMAGES / name).read_bytes(), repeat=2, target=(224, 224))
    assert t.error and t.decode_ms == () and t.first_decode_ms is None
    assert row(t).error == t.error


def test_measure_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="repeat"):
        measure("x", b"", repeat=0, target=(1, 1))
    with pytest.raises(ValueError, match="target"):
        measure("x", b"", repeat=1, target=(0, 5))


# --- imaging.decode(draft=) ----------------------------------------------------------------------


def test_draft_decode_is_smaller_and_records_the_source_size_and_scale(captured, photo_12mp: Path) -> None:
    image = imaging.decode(photo_12mp.read_bytes(), draft=(224, 224))
    assert image.size == (500, 375) and image.mode == "RGB"
    span = captured.one("decode")
    assert span.attributes[semconv.IMAGE_DRAFT_SCALE] == 8
    assert (span.attributes[semconv.IMAGE_WIDTH], span.attributes[semconv.IMAGE_HEIGHT]) == (4000, 3000)


def test_draft_follows_exif_orientation(captured) -> None:
    data = jpeg_photo((2000, 1000), seed=1, orientation=6)  # stored 2000x1000, displayed 1000x2000
    image = imaging.decode(data, draft=(250, 500))  # as displayed: fits 1/4 in both directions
    assert image.size == (250, 500)
    span = captured.one("decode")
    assert (span.attributes[semconv.IMAGE_WIDTH], span.attributes[semconv.IMAGE_HEIGHT]) == (1000, 2000)
    assert span.attributes[semconv.IMAGE_DRAFT_SCALE] == 4


def test_draft_is_ignored_for_png_and_absent_without_draft(captured) -> None:
    image = imaging.decode((IMAGES / "rgba_800x600.png").read_bytes(), draft=(64, 64))
    assert image.size == (800, 600)
    imaging.decode((IMAGES / "photo_320x240.jpg").read_bytes())
    spans = captured.by_name("decode")
    assert len(spans) == 2
    assert all(semconv.IMAGE_DRAFT_SCALE not in span.attributes for span in spans)


def test_draft_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="draft size"):
        imaging.decode(b"x", draft=(0, 10))


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_json_table(photo_12mp: Path, capsys) -> None:
    args = ["decode-bench", str(photo_12mp), str(IMAGES / "photo_320x240.jpg"),
            str(IMAGES / "rgba_800x600.png"), "--repeat", "2", "--size", "224x224", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["repeat"] == 2 and out["size"] == {"width": 224, "height": 224}
    rows = {Path(r["name"]).name: r for r in out["images"]}
    big = rows["photo_12mp.jpg"]
    assert (big["width"], big["height"], big["draft_scale"]) == (4000, 3000, 8)
    assert big["draft_speedup"] is not None and big["decode_median_ms"] > 0
    assert rows["rgba_800x600.png"]["draft_speedup"] is None
    assert any(f.startswith("decode cost") for f in out["findings"])
    assert captured.err == ""  # no progress bar with --json or off a terminal


def test_cli_text_with_a_bad_and_a_missing_file(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.jpg"
    assert main(["decode-bench", str(IMAGES / "photo_320x240.jpg"), str(IMAGES / "truncated.jpg"),
                 str(missing), "--repeat", "2"]) == 1
    captured = capsys.readouterr()
    assert "\x1b[" not in captured.out + captured.err  # plain text off a terminal
    lines = captured.out.splitlines()
    assert lines[0].startswith("decode-bench: 2 decodes per image")
    assert any(re.search(r"320x240\s+36\.4 kB", line) for line in lines)  # long paths fold
    assert "not measured: cannot read" in captured.out
    assert "truncated.jpg: corrupt or truncated JPEG" in captured.err
    assert f"{missing}: cannot read: No such file or directory" in captured.err


@pytest.mark.parametrize(("args", "message"), [
    (["--size", "224"], "expected WIDTHxHEIGHT"),
    (["--size", "0x10"], "each side must be 1 to"),
    (["--repeat", "1"], "must be >= 2"),
])
def test_cli_usage_errors(args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["decode-bench", str(IMAGES / "photo_320x240.jpg"), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_help_gives_units(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["decode-bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "resize target in pixels" in text and "milliseconds" in text
    assert "first reported apart" in text


# --- the progress helper ---------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_only_on_a_terminal() -> None:
    piped = io.StringIO()
    with progress("work", 3, stream=piped) as bar:
        for _ in range(3):
            bar.advance()
    assert piped.getvalue() == "" and not is_terminal(piped)

    tty = _Terminal()
    with progress("work", 3, stream=tty, unit="runs") as bar:
        bar.advance(3)
    assert "work" in tty.getvalue()

    off = _Terminal()
    with progress("work", 3, stream=off, enabled=False) as bar:  # --json
        bar.advance(3)
    assert off.getvalue() == ""


@pytest.mark.parametrize(("env", "coloured"), [({}, True), ({"NO_COLOR": "1"}, False),
                                               ({"TERM": "dumb"}, False)])
def test_colour_on_a_terminal_degrades_cleanly(env: dict, coloured: bool, monkeypatch) -> None:
    from otel_stages.commands.decode_bench import render

    for key in ("NO_COLOR", "FORCE_COLOR", "TERM", "COLORTERM"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bench = summarize([DecodeTimings(name="bad.jpg", size_bytes=3, error="not an image")],
                      repeat=2, target=(8, 8))
    tty = _Terminal()
    render(bench, tty)
    text = tty.getvalue()
    assert "bad.jpg" in text and "not an image" in text
    assert bool(re.search(r"\x1b\[[0-9;]*3[0-9]m", text)) is coloured  # a foreground colour


def test_closed_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    stream.close()
    assert is_terminal(stream) is False


def test_bad_image_bytes_through_pillow_are_not_a_crash() -> None:
    # Pillow opens the header lazily: the benchmark's format probe must not raise either
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    head = buffer.getvalue()[:40]
    assert measure("head.jpg", head, repeat=2, target=(4, 4)).error
