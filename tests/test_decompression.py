"""One dispatch takes the compression off a trace file (analysis.chunks.decompressed), for the
file report's reader (analysis.formats) and import's (analysis.clickhouse_files) alike: gzip and
zstd by magic bytes, nested at most MAX_NESTING deep, data cut short said per layer."""

from __future__ import annotations

import ast
import gzip
from pathlib import Path

import zstandard

from otel_stages.analysis.chunks import MAX_NESTING, decompressed
from otel_stages.analysis.clickhouse_files import export_requests
from otel_stages.analysis.formats import decode

PACKAGE = Path(__file__).resolve().parent.parent / "otel_stages" / "analysis"
STABLE = (Path(__file__).parent / "data" / "traces" / "stable.otlp.jsonl").read_bytes()


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def test_layers_come_off_in_order_and_name_the_stream() -> None:
    problems: list[str] = []
    plain = decompressed(iter([gzip.compress(_zstd(STABLE))]), "f", problems)
    assert (plain.name, plain.depth, plain.too_deep) == ("f (gzip) (zstd)", 2, False)
    assert plain.head == STABLE[:len(plain.head)] and len(plain.head) >= 8
    assert b"".join(plain.chunks) == STABLE
    assert plain.cut_problems() == [] and problems == []


def test_plain_bytes_pass_through() -> None:
    plain = decompressed(iter([b"{}", b"\n"]), "f", [])
    assert (plain.name, plain.depth, b"".join(plain.chunks)) == ("f", 0, b"{}\n")


def test_more_than_max_nesting_layers_are_not_read() -> None:
    data = STABLE
    for _ in range(MAX_NESTING + 1):
        data = gzip.compress(data)
    problems: list[str] = []
    plain = decompressed(iter([data]), "f", problems)
    assert plain.too_deep and b"".join(plain.chunks) == b""
    assert problems == [f"f{' (gzip)' * (MAX_NESTING + 1)}: compressed more than {MAX_NESTING}"
                        " times over; not read"]
    assert not decompressed(iter([gzip.compress(STABLE)]), "f", [], depth=MAX_NESTING - 1).too_deep


def test_a_cut_is_known_once_read_outermost_first() -> None:
    whole = _zstd(gzip.compress(STABLE))
    plain = decompressed(iter([whole[: len(whole) * 2 // 3]]), "f", [])
    assert plain.cut_problems() == []  # nothing pulled yet past the head
    b"".join(plain.chunks)
    assert plain.cut_problems() == [
        "f: zstd data cut short or damaged (the last frame has no end); read what came before",
        "f (zstd): gzip data cut short or damaged (the last member has no end); read what came"
        " before"]


def test_both_readers_say_the_same_cuts_each_in_its_order() -> None:
    """The file report says the cuts before what the cut content gave (it happened first), import
    after the documents it yielded, innermost first: each as before the dispatch was shared."""
    whole = _zstd(gzip.compress(STABLE))
    data = whole[: len(whole) * 2 // 3]
    file_problems = decode(data, "f").problems
    import_problems: list[str] = []
    docs = list(export_requests(iter([data]), "f", import_problems))
    cuts = decompressed(iter([data]), "f", [])
    b"".join(cuts.chunks)
    assert file_problems[:2] == cuts.cut_problems()
    assert import_problems[-2:] == cuts.cut_problems()[::-1]
    assert [where for where, _ in docs] == ["f (zstd) (gzip):1", "f (zstd) (gzip):2"]


def _names_used(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


def test_neither_reader_has_its_own_dispatch() -> None:
    """The magic-number dispatch lives in chunks.decompressed only: a reader that sniffs gzip
    again (GZIP_MAGIC, gunzip) has grown a copy."""
    for module in ("formats", "clickhouse_files"):
        used = _names_used(module)
        assert "decompressed" in used, module
        assert not used & {"GZIP_MAGIC", "gunzip"}, module
