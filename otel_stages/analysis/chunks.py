"""Byte streams as chunks: sniffing the head, decompressing gzip and zstd as chunks arrive,
exact-size reads, and splitting into lines. Pure; used by :mod:`otel_stages.analysis.formats`.

A chunk iterator is what a file gives when read :data:`CHUNK_BYTES` at a time; every function
here pulls chunks only as it needs them, so memory holds a chunk (and a line), not the file.
Decompressors report an early stop (data cut short or damaged) by appending why to ``cut``
and ending; what decompressed before stays yielded. :func:`decompressed` takes every layer of
compression off a stream, by magic bytes: the one dispatch both file readers use (the file
report's :mod:`~otel_stages.analysis.formats` and import's
:mod:`~otel_stages.analysis.clickhouse_files`).
"""

from __future__ import annotations

import codecs
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Bytes read (and decompressed) at a time.
CHUNK_BYTES = 1 << 20
#: Bytes :func:`peek` makes sure the first chunk has (magic numbers, the framing's first record).
HEAD_BYTES = 8
#: Compressed inside compressed inside ...: deeper than this is not a trace file.
MAX_NESTING = 3


def read_stream(stream: IO[bytes], failed: list[OSError],
                on_chunk: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """``stream`` read :data:`CHUNK_BYTES` at a time; ``on_chunk(size)`` after each chunk. A read
    error (a disk error, a file truncated under us) ends the chunks and is appended to ``failed``:
    what came before it stays yielded."""
    while True:
        try:
            chunk = stream.read(CHUNK_BYTES)
        except OSError as exc:
            failed.append(exc)
            return
        if not chunk:
            return
        if on_chunk is not None:
            on_chunk(len(chunk))
        yield chunk


def length_prefixed_records(chunks: Iterator[bytes], name: str, problems: list[str]
                            ) -> Iterator[tuple[int, bytes]]:
    """``(number, record)`` of the Collector file exporter's binary framing (a 4-byte big-endian
    length, then the record; numbered from 1), read from ``chunks`` as they come; the last record
    may be cut short. A zero length ends the records, with a problem naming it."""
    reader = ByteReader(chunks)
    number = 0
    while True:
        prefix = reader.read(4)
        if len(prefix) < 4:
            return
        number += 1
        size = int.from_bytes(prefix, "big")
        if size == 0:
            problems.append(f"{name} record {number}: length 0 in the length-prefixed framing; the"
                            " rest of the file is not read")
            return
        yield number, reader.read(size)


def peek(chunks: Iterator[bytes]) -> tuple[bytes, Iterator[bytes]]:
    """The first chunk, grown to at least :data:`HEAD_BYTES` when the input has them, and an
    iterator that yields it and then the rest."""
    head = b""
    for chunk in chunks:
        head += chunk
        if len(head) >= HEAD_BYTES:
            break

    def again() -> Iterator[bytes]:
        if head:
            yield head
        yield from chunks

    return head, again()


def _members(chunks: Iterator[bytes], cut: list[str], magic: bytes, padding: bytes,
             start: Callable[[], Any], errors: type[Exception] | tuple[type[Exception], ...],
             unit: str, flush: bool) -> Iterator[bytes]:
    """Every compressed member (gzip) or frame (zstd) in turn, as chunks are read: each starts
    with ``magic`` (after optional ``padding`` bytes between members), ``start()`` makes its
    decompressor (``decompress``, ``eof``, ``unused_data``; ``flush`` when ``flush``). Anything
    else after the last member ends the stream (as ``gzip -d`` ignores trailing garbage); on an
    early stop, ``cut`` gets why."""
    d: Any = None
    data = b""
    for chunk in chunks:
        data = data + chunk if data else chunk
        while data:
            if d is None:
                if padding:
                    data = data.lstrip(padding)
                if len(data) < len(magic):
                    break  # wait for more (or the end)
                if not data.startswith(magic):
                    return
                d = start()
            try:
                out = d.decompress(data)
            except errors as exc:
                cut.append(str(exc))
                return
            if out:
                yield out
            if d.eof:
                data, d = d.unused_data, None
            else:
                data = b""
    if d is not None:
        if flush:
            tail = d.flush()
            if tail:
                yield tail
        cut.append(f"the last {unit} has no end")


def gunzip(chunks: Iterator[bytes], cut: list[str]) -> Iterator[bytes]:
    """Every gzip member in turn (zero padding between members allowed, as gzip does), as chunks
    are read; on an early stop, ``cut`` gets why."""
    return _members(chunks, cut, GZIP_MAGIC, b"\0",
                    lambda: zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), zlib.error, "member",
                    flush=True)


def unzstd(chunks: Iterator[bytes], cut: list[str]) -> Iterator[bytes]:
    """Every zstd frame in turn (streamed frames without a content size too), as chunks are read;
    on an early stop, ``cut`` gets why."""
    import zstandard  # a dependency; imported here so plain JSON files never load it

    dctx = zstandard.ZstdDecompressor()
    return _members(chunks, cut, ZSTD_MAGIC, b"", dctx.decompressobj, zstandard.ZstdError, "frame",
                    flush=False)


class ByteReader:
    """Exact-size reads over a chunk iterator (for length-prefixed records)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def read(self, size: int) -> bytes:
        """``size`` bytes, or fewer at the end of the input."""
        parts, have = [self._buffer], len(self._buffer)
        while have < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self._buffer = data[size:]
        return data[:size]


def split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Lines as ``bytes.splitlines`` gives them (``\n``, ``\r\n`` and ``\r`` end a line), from
    chunks that may cut lines anywhere; a line longer than a chunk is joined once, not re-copied."""
    parts: list[bytes] = []
    for chunk in chunks:
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            parts.append(chunk)
            continue
        if parts:
            parts.append(pieces[0])
            pieces[0] = b"".join(parts)
        tail = pieces.pop()
        parts = [tail] if tail else []
        for piece in pieces:
            if b"\r" in piece:
                yield from piece.splitlines() or [b""]
            else:
                yield piece
    last = b"".join(parts)
    if last:
        yield from last.splitlines()


class Tee:
    """Chunks passed through while remembering them, until :meth:`forget`."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.seen: list[bytes] | None = []

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            if self.seen is not None:
                self.seen.append(chunk)
            yield chunk

    def forget(self) -> None:
        """Stop remembering and drop what was remembered."""
        self.seen = None


def strip_bom(chunks: Iterator[bytes]) -> Iterator[bytes]:
    first = next(chunks, b"")
    yield first.removeprefix(codecs.BOM_UTF8)  # Windows editors and PowerShell write one
    yield from chunks


@dataclass
class Decompressed:
    """A stream with its compression taken off (:func:`decompressed`): ``head`` (its first
    bytes) and ``chunks`` (all of it, the head included, decompressed as they are pulled),
    ``name`` (the caller's, with ``(gzip)`` / ``(zstd)`` per layer), ``depth`` (the caller's plus
    one per layer); ``too_deep`` when it was compressed more than :data:`MAX_NESTING` times over
    (then not to be read: the problem is said)."""

    head: bytes
    chunks: Iterator[bytes]
    name: str
    depth: int
    too_deep: bool = False
    _layers: list[tuple[str, str, list[str]]] = field(default_factory=list)

    def cut_problems(self) -> list[str]:
        """One problem per layer whose data was cut short or damaged, the outermost first: known
        once ``chunks`` has been read (decompression is lazy)."""
        return [f"{name}: {kind} data cut short or damaged ({cut[0]}); read what came before"
                for name, kind, cut in self._layers if cut]


def decompressed(chunks: Iterator[bytes], name: str, problems: list[str], depth: int = 0
                 ) -> Decompressed:
    """``chunks`` with every gzip / zstd layer taken off, by magic bytes (never by name), nested
    at most :data:`MAX_NESTING` deep below ``depth``; past that the problem ``"<name>: compressed
    more than 3 times over; not read"`` is appended and ``too_deep`` set. Nothing is
    decompressed beyond the head until ``chunks`` is pulled: read it, then say
    :meth:`Decompressed.cut_problems`."""
    layers: list[tuple[str, str, list[str]]] = []
    while True:
        if depth > MAX_NESTING:
            problems.append(f"{name}: compressed more than {MAX_NESTING} times over; not read")
            return Decompressed(b"", iter(()), name, depth, True, layers)
        head, chunks = peek(chunks)
        for magic, kind, decompress in ((GZIP_MAGIC, "gzip", gunzip), (ZSTD_MAGIC, "zstd", unzstd)):
            if head.startswith(magic):
                cut: list[str] = []
                layers.append((name, kind, cut))
                chunks, name, depth = decompress(chunks, cut), f"{name} ({kind})", depth + 1
                break
        else:
            return Decompressed(head, chunks, name, depth, False, layers)
