"""Files are streamed: memory follows the records kept, not the file; any chunking reads the same;
spans of one trace may sit in different lines and files; progress is reported as bytes are read;
the cyclic garbage collector is paused while records are built and restored after."""

from __future__ import annotations

import gc
import gzip
import io
import json
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from otel_stages import semconv
from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.compact import Compactor
from otel_stages.analysis.files import load_bytes, load_file, load_stream
from otel_stages.analysis.formats import read_chunks
from otel_stages.analysis.requests import find_requests
from otel_stages.analysis.selection import for_analysis

CASES = Path(__file__).parent / "data" / "traces"
T0 = 1_790_000_000_000_000_000
MS = 1_000_000


def _span(trace: int, span: int, name: str, start_ms: float, end_ms: float, parent: int | None = None,
          attributes: list | None = None) -> dict:
    out = {"traceId": f"{trace:032x}", "spanId": f"{span:016x}", "name": name, "kind": 1,
           "startTimeUnixNano": str(T0 + int(start_ms * MS)),
           "endTimeUnixNano": str(T0 + int(end_ms * MS)), "status": {}}
    if parent is not None:
        out["parentSpanId"] = f"{parent:016x}"
    if attributes:
        out["attributes"] = attributes
    return out


def _line(spans: list[dict]) -> bytes:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}},
                               {"key": "service.instance.id", "value": {"stringValue": "p1"}}]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
        {"scope": {"name": "otel_stages"}, "spans": spans}]}]}, separators=(",", ":")).encode()


def _request(i: int, *, url_bytes: int = 0) -> list[dict]:
    """The spans of request ``i``: request span + download + decode + forward."""
    trace, request = 1000 + i, 10 * i + 1
    t = i * 100.0
    url = [{"key": semconv.URL_FULL, "value": {"stringValue": f"https://x/{i}/" + "a" * url_bytes}}] if url_bytes else []
    return [
        _span(trace, request + 1, "download", t + 1, t + 5, request,
              [*url, {"key": semconv.IMAGE_SIZE, "value": {"intValue": "5000"}}]),
        _span(trace, request + 2, "decode", t + 5, t + 9, request,
              [{"key": semconv.IMAGE_WIDTH, "value": {"intValue": "640"}},
               {"key": semconv.IMAGE_HEIGHT, "value": {"intValue": "480"}}]),
        _span(trace, request + 3, "forward", t + 9, t + 30, request),
        _span(trace, request, "request", t, t + 31, None,
              [{"key": semconv.REQUEST_SEQ, "value": {"intValue": str(i + 1)}}]),
    ]


def _file(n: int, per_line: int = 50, **kwargs: int) -> bytes:
    spans = [s for i in range(n) for s in _request(i, **kwargs)]
    return b"\n".join(_line(spans[k:k + per_line]) for k in range(0, len(spans), per_line)) + b"\n"


def test_memory_follows_the_records_kept_not_the_file(tmp_path: Path):
    """A 40 MB file whose spans carry 40 kB URLs the analysis never reads: loading it for the
    analysis peaks at a few MB (a chunk and a line at a time, URLs dropped); keeping every
    attribute holds the URLs, so the same load peaks above the file size."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(_file(1000, url_bytes=40_000))
    size = path.stat().st_size
    assert size > 40_000_000

    def peak(**kwargs: object) -> tuple[int, int]:
        tracemalloc.start()
        try:
            recording = load_paths([path], **kwargs)  # type: ignore[arg-type]
            return tracemalloc.get_traced_memory()[1], len(recording.spans)
        finally:
            tracemalloc.stop()

    selected, n = peak(selection=for_analysis())
    assert n == 4000
    assert selected < size / 5, (selected, size)
    everything, _ = peak()
    assert everything > size * 0.9, (everything, size)


def test_any_chunking_reads_the_same():
    lines = CASES.joinpath("gpu_busy.otlp.jsonl").read_bytes().splitlines()
    # a BOM, CRLF and lone CR line ends, blank lines and a bad line, whose number must survive
    data = (b"\xef\xbb\xbf" + lines[0] + b"\r\n\r\n" + b"{not json\r" + b"\n".join(lines[1:]) + b"\n\n")
    whole = load_bytes(data, "f")
    assert len(whole.spans) == 180 and whole.metrics
    assert whole.problems == ["f:3: not valid JSON (Expecting property name enclosed in double quotes:"
                              " line 1 column 2)"]
    for size in (1, 7, 1000, 1 << 20):
        into = Compactor()
        read_chunks((data[i:i + size] for i in range(0, len(data), size)), "f", into)
        assert (into.out.spans, into.out.metrics, into.out.problems) == (
            whole.spans, whole.metrics, whole.problems), size


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_compressed_streams_in_small_chunks(compress):
    data = _file(30)
    packed = gzip.compress(data) if compress == "gzip" else zstandard.ZstdCompressor().compress(data)
    into = Compactor()
    read_chunks((packed[i:i + 5] for i in range(0, len(packed), 5)), "f", into)
    assert into.out.problems == [] and len(into.out.spans) == 120
    assert into.out.spans == load_bytes(data, "f").spans


def test_a_zero_length_record_ends_the_framed_zstd_file_with_a_problem():
    frame = zstandard.ZstdCompressor().compress(_file(3))
    record = len(frame).to_bytes(4, "big") + frame
    out = load_bytes(record + b"\0\0\0\0" + record, "t.zst")
    assert len(out.spans) == 12
    assert out.problems == ["t.zst record 2: length 0 in the length-prefixed framing; the rest of"
                            " the file is not read"]


def test_spans_of_one_request_spread_over_lines_and_files(tmp_path: Path):
    spans = _request(0) + _request(1)
    (tmp_path / "a.jsonl").write_bytes(_line(spans[3:4]) + b"\n" + _line(spans[0:1]) + b"\n")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(_line(spans[1:3] + spans[4:6]) + b"\n"))
    (tmp_path / "c.jsonl").write_bytes(_line(spans[6:8]) + b"\n")
    recording = load_paths([tmp_path], selection=for_analysis())
    assert recording.problems == []
    first, second = find_requests(recording.spans)
    assert set(first.stages_ms) == set(second.stages_ms) == {"download", "decode", "forward"}
    assert (first.image_width, first.image_height, first.seq) == (640, 480, 1)


class _Progress:
    def __init__(self) -> None:
        self.totals: list[float | None] = []
        self.done = 0.0

    def set_total(self, total: float | None) -> None:
        self.totals.append(total)

    def advance(self, units: float = 1.0) -> None:
        self.done += units


def test_progress_counts_the_bytes_on_disk_as_they_are_read(tmp_path: Path):
    (tmp_path / "a.jsonl").write_bytes(_file(40))
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(_file(40)))
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    progress = _Progress()
    recording = load_paths([tmp_path], progress=progress)
    assert len(recording.spans) == 320
    assert progress.totals == [size] and progress.done == size
    single = _Progress()
    load_file(tmp_path / "a.jsonl", progress=single)
    assert single.done == (tmp_path / "a.jsonl").stat().st_size


def test_a_stream_is_read_to_its_end():
    data = _file(20)
    recording = load_stream(io.BytesIO(data), "<stdin>", selection=for_analysis())
    assert len(recording.spans) == 80 and recording.problems == []
    assert diagnose(recording).requests == 20


class _Failing(io.RawIOBase):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        if not self.data:
            raise OSError(5, "Input/output error")
        n = min(len(buffer), len(self.data))
        buffer[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


def test_a_read_error_is_a_problem_and_what_came_before_is_kept():
    recording = load_stream(_Failing(_file(10)), "<stdin>")  # type: ignore[arg-type]
    assert len(recording.spans) == 40
    assert recording.problems == ["<stdin>: cannot read (Input/output error); read what came before"]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_restored_as_it_was(enabled, tmp_path: Path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(_file(5))
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        seen = []

        class Watch(_Progress):
            def advance(self, units: float = 1.0) -> None:
                seen.append(gc.isenabled())

        load_paths([path], progress=Watch())
        assert seen and not any(seen)  # paused while reading
        assert gc.isenabled() is enabled
        diagnose(load_paths([path]))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
