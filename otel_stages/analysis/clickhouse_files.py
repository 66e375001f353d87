"""The OTLP/JSON export requests ``otel-stages import`` loads, from files, folders and standard
input, in the file kinds the file report reads (:mod:`otel_stages.analysis.formats`, whose
layers this follows):

1. **Compression**, by magic bytes, not by name: gzip (several members in turn) and zstd (several
   frames in turn, and the Collector ``file`` exporter's default framing with compression on: a
   4-byte big-endian length, then one zstd frame per export, contrib
   ``exporter/fileexporter/file_writer.go``), nested at most
   :data:`~otel_stages.analysis.chunks.MAX_NESTING` deep; decompressed as it is read, by the
   file report's own dispatch (:func:`otel_stages.analysis.chunks.decompressed`). Data cut
   short keeps what came before, with a problem.
2. **Framing**: JSON lines (one export request per line, the Collector ``file`` exporter's
   format and what ``otel_stages.configure()`` writes), streamed line by line; else the whole
   text: one pretty-printed document, a JSON array of them, or several documents in a row.

Folders are searched for :data:`~otel_stages.analysis.files.FOLDER_SUFFIXES` (``*.jsonl``,
``*.json.gz``, ``*.jsonl.zst``...), as the file report does; ``-`` is standard input. Every
unreadable part is a problem (``"<file>:<line>: ..."``); the rest is still yielded. OTLP
protobuf, images and other binary files are named, not read. Jaeger and Tempo JSON are not OTLP
export requests: the import names each such document (``clickhouse_rows``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from otel_stages.analysis.chunks import (
    ZSTD_MAGIC,
    Tee,
    decompressed,
    length_prefixed_records,
    read_stream,
    split_lines,
    strip_bom,
)
from otel_stages.analysis.files import COMPRESSED_SUFFIXES, DATA_SUFFIXES, FOLDER_SUFFIXES
from otel_stages.analysis.formats import (
    BAD,
    binary_kind,
    concatenated_documents,
    json_or_bad,
)

#: The path that names standard input (as for ``otel-stages report -``).
STDIN = "-"
#: How standard input is named in problems.
STDIN_NAME = "<stdin>"


def iter_files(paths: Iterable[str | os.PathLike[str]], problems: list[str]) -> list[Path | str]:
    """Files named, and files under folders named whose names end in one of
    :data:`~otel_stages.analysis.files.FOLDER_SUFFIXES` (recursively, sorted), and :data:`STDIN`
    where ``-`` is given. A missing path or a folder without such files is a problem. Each real
    file (and stdin) once."""
    found: list[Path | str] = []
    seen: set[str] = set()
    for raw in paths:
        if os.fspath(raw) == STDIN:
            if STDIN not in seen:
                seen.add(STDIN)
                found.append(STDIN)
            continue
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(FOLDER_SUFFIXES))
            if not files:
                endings = ", ".join(f"*{s}" for s in (*DATA_SUFFIXES, *COMPRESSED_SUFFIXES))
                problems.append(f"{path}: no trace files ({endings}) in this folder; a file named"
                                " otherwise is read when given by name")
        elif path.exists():
            files = [path]
        else:
            problems.append(f"{path}: no such file or folder")
            continue
        for file in files:
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                found.append(file)
    return found


def iter_export_requests(path: Path | str, problems: list[str]) -> Iterator[tuple[str, Any]]:
    """``(where, decoded JSON document)`` for each export request in one file (``-``: standard
    input), whatever its compression and framing (see the module docstring). Unreadable files,
    lines and records are problems; the rest is still yielded."""
    if path == STDIN:
        stream: IO[bytes] | None = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text-only stdin (tests, embedded interpreters)
            yield from export_requests(iter([sys.stdin.read().encode("utf-8")]), STDIN_NAME,
                                       problems)
            return
        yield from _from_stream(stream, STDIN_NAME, problems)
        return
    try:
        opened = Path(path).open("rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        problems.append(f"{path}: cannot read ({exc.strerror or exc})")
        return
    with opened:
        yield from _from_stream(opened, str(path), problems)


def _from_stream(stream: IO[bytes], name: str, problems: list[str]) -> Iterator[tuple[str, Any]]:
    failed: list[OSError] = []
    yield from export_requests(read_stream(stream, failed), name, problems)
    if failed:
        problems.append(f"{name}: cannot read ({failed[0].strerror or failed[0]}); read what came"
                        " before")


def export_requests(chunks: Iterator[bytes], name: str, problems: list[str], depth: int = 0
                    ) -> Iterator[tuple[str, Any]]:
    """The documents in a byte stream given as chunks (``name`` prefixes problems); see
    :func:`iter_export_requests`."""
    plain = decompressed(chunks, name, problems, depth)  # the file report's dispatch (chunks)
    if not plain.too_deep:
        yield from _plain(plain.head, plain.chunks, plain.name, problems, plain.depth)
    # after what the cut-short content gave, the innermost layer first
    problems.extend(reversed(plain.cut_problems()))


def _plain(head: bytes, chunks: Iterator[bytes], name: str, problems: list[str], depth: int
           ) -> Iterator[tuple[str, Any]]:
    """Uncompressed bytes (``head``: the first of ``chunks``): framing, then documents."""
    if len(head) >= 8 and head[4:8] == ZSTD_MAGIC:
        yield from _zstd_records(chunks, name, problems, depth)
        return
    binary = binary_kind(head)
    if binary is not None:
        problems.append(f"{name}: {binary}, not an OTLP/JSON file; not read")
        return
    yield from _text(chunks, name, problems)


def _zstd_records(chunks: Iterator[bytes], name: str, problems: list[str], depth: int
                  ) -> Iterator[tuple[str, Any]]:
    """The Collector file exporter's compressed framing: a 4-byte big-endian length, then one
    zstd frame (one export) per record; the last record may be cut short."""
    for number, record in length_prefixed_records(chunks, name, problems):
        yield from export_requests(iter([record]), f"{name} record {number}", problems, depth + 1)


def _text(chunks: Iterator[bytes], name: str, problems: list[str]) -> Iterator[tuple[str, Any]]:
    """JSON lines, streamed; when the first non-blank line is no JSON document, the whole text
    (a document, an array of them, or documents in a row), else its lines."""
    tee = Tee(strip_bom(chunks))
    lines = enumerate(split_lines(iter(tee)), start=1)
    for number, raw in lines:
        if not raw.strip():
            continue
        obj = json_or_bad(raw)
        if obj is BAD:
            seen = tee.seen or []
            tee.forget()
            yield from _whole(b"".join(seen) + b"".join(tee.chunks), name, problems)
            return
        tee.forget()
        yield f"{name}:{number}", obj
        break
    yield from _documents(lines, name, problems)


def _whole(data: bytes, name: str, problems: list[str]) -> Iterator[tuple[str, Any]]:
    docs = concatenated_documents(data)
    if docs is not None:
        for doc, line in docs:
            where = f"{name}:{line}" if len(docs) > 1 else name
            if isinstance(doc, list):
                for i, item in enumerate(doc):
                    yield f"{where}[{i}]", item
            else:
                yield where, doc
        return
    yield from _documents(enumerate(data.splitlines(), start=1), name, problems)


def _documents(lines: Iterable[tuple[int, bytes]], name: str, problems: list[str]
               ) -> Iterator[tuple[str, Any]]:
    """The JSON document of each numbered line (blank ones skipped); a line that is none is a
    problem naming it."""
    for number, raw in lines:
        if raw.strip():
            obj = json_or_bad(raw)
            if obj is BAD:
                problems.append(f"{name}:{number}: {_why(raw)}")
            else:
                yield f"{name}:{number}", obj


def _why(raw: bytes) -> str:
    try:
        json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    return "not valid JSON"
