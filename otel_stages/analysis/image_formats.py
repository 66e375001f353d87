"""One name per image format: ``image.format`` as the library's own decode spans write it
(Pillow's format name, ``Image.format``: ``JPEG``, ``PNG``, ``WEBP``), whatever spelling a
service recorded. One input written ``JPEG`` by one replica and ``image/jpeg`` by another is one
input: read as two, the input mix "explained" a swing that was between the replicas, and the
advice was about inputs.

The names come from Pillow's own tables, not a hand list (:func:`format_aliases`):

- ``PIL.Image.MIME`` (format -> MIME type): ``image/jpeg`` -> ``JPEG``, ``image/x-icon`` ->
  ``ICO``, ``application/pdf`` -> ``PDF``; where two formats share a MIME type (``BMP`` and
  ``DIB``: ``image/bmp``) the one the type names wins;
- ``PIL.Image.registered_extensions()`` (extension -> format): ``jpg`` -> ``JPEG``, ``tif`` ->
  ``TIFF``, and written as a MIME type (``image/jpg``, ``image/tif``);
- the format names themselves, as MIME types (``image/mpo``), and each of these with the
  unregistered ``x-`` prefix (``image/x-png``, ``image/x-tiff``, ``image/x-bmp``).

Only MIME types Pillow registers nowhere are listed by hand (:data:`EXTRA_ALIASES`: ``image/pjpeg``,
HEIC / HEIF from the ``pillow-heif`` plugin ...). Case does not matter. A name none of these know
stays itself, case-folded as its kind is written: a MIME type in lower case, a bare name in upper
case (Pillow's names are), so ``jxl`` and ``JXL`` are one input too.

The SQL applies the same table (:func:`otel_stages.analysis.clickhouse_sql.format_text`: a
``transform`` over :func:`format_aliases`), so both reports name the same cohorts.
"""

from __future__ import annotations

from functools import cache

#: MIME types (and one extension) Pillow's tables do not hold, with the Pillow format name a
#: decoder gives such a file. Pillow's own tables win where they hold a key.
EXTRA_ALIASES: dict[str, str] = {
    "image/pjpeg": "JPEG",  # progressive JPEG, as old Internet Explorer uploads name it
    "image/x-ms-bmp": "BMP",  # Python's mimetypes before 3.11, and file(1)
    "image/vnd.microsoft.icon": "ICO",  # IANA's registration (Pillow registers image/x-icon)
    "image/x-portable-pixmap": "PPM",  # Pillow registers image/x-portable-anymap for all four
    "image/x-portable-graymap": "PPM",
    "image/x-portable-bitmap": "PPM",
    "image/avif": "AVIF",  # older Pillow has no AVIF plugin (pillow-avif-plugin's name)
    # pillow-heif's plugin (HeifImageFile.format) names HEIC and HEIF files alike
    "image/heic": "HEIF",
    "image/heic-sequence": "HEIF",
    "image/heif": "HEIF",
    "image/heif-sequence": "HEIF",
    "heic": "HEIF",
    "hif": "HEIF",
}


#: Formats read as another because their images are that one's (checked before Pillow's tables):
#: an MPO is a camera's JPEG with extra frames, decoded as its first JPEG frame; Pillow names
#: camera photos MPO where a Content-Type says image/jpeg (a tester: one replica recording each,
#: same photos, read as two inputs that "explained" the replicas' difference).
SAME_CODING: dict[str, str] = {"mpo": "JPEG", "image/mpo": "JPEG", "image/x-mpo": "JPEG"}


def _default(name: str) -> str:
    """What a name no table knows reads as (module docstring): ``name`` already lower case."""
    return name if "/" in name else name.upper()


@cache
def format_aliases() -> dict[str, str]:
    """Lower-case spelling -> Pillow format name, for every spelling whose name is not what
    :func:`canonical_format` makes of an unknown one (a bare name upper-cased: ``png`` needs no
    entry). Built once from Pillow's tables (module docstring; importing every Pillow plugin
    takes a fraction of a second, so only a report that reads a format pays it)."""
    from PIL import Image  # a dependency of the package; here, only the tables are read

    Image.init()
    table: dict[str, str] = {}

    def add(key: str, name: str) -> None:
        key = key.lower()
        if key not in table and _default(key) != name:
            table[key] = name

    for key, name in SAME_CODING.items():
        add(key, name)
    by_mime: dict[str, list[str]] = {}
    for name, mime in Image.MIME.items():
        by_mime.setdefault(mime.lower(), []).append(name)
    for mime, names in sorted(by_mime.items()):
        subtype = mime.split("/", 1)[1]
        # the format the type names first (image/bmp: BMP, not DIB), then by name
        add(mime, min(names, key=lambda n: (n.lower() != subtype, n)))
    for key, name in EXTRA_ALIASES.items():
        add(key, name)
    names = sorted({*Image.ID, *Image.MIME, *Image.registered_extensions().values()})
    known = {n.lower() for n in names}
    spellings = [(n.lower(), n) for n in names]
    spellings += sorted((ext.lstrip(".").lower(), name)
                        for ext, name in Image.registered_extensions().items()
                        if ext.lstrip(".").lower() not in known)  # a format's own name wins
    for spelling, name in spellings:
        add(spelling, name)
        add(f"image/{spelling}", name)
        add(f"image/x-{spelling}", name)
    return table


def canonical_format(name: str) -> str:
    """Pillow's format name for ``name`` (a format name, a file extension or a MIME type, any
    case, already without a MIME type's parameters and blanks): ``image/jpeg`` -> ``JPEG``,
    ``jpg`` -> ``JPEG``, ``png`` -> ``PNG``; an unknown MIME type in lower case, an unknown name
    in upper case (module docstring)."""
    low = name.lower()
    return format_aliases().get(low) or _default(low)
