"""Build small matrix/TRC ICC v2 profiles for colour tests (Pillow can only create sRGB, Lab and
XYZ profiles itself, and the test machine has no profile files).

Layout per ICC.1:2001-04 (the v2 specification LittleCMS reads): a 128-byte header, a tag table,
then tag data aligned to 4 bytes: ``desc`` (textDescriptionType), ``cprt`` (textType), ``wtpt``,
``rXYZ`` / ``gXYZ`` / ``bXYZ`` (XYZType, D50-adapted colorants) and ``rTRC`` / ``gTRC`` /
``bTRC`` (curveType with one gamma value).
"""

from __future__ import annotations

import struct

D50 = (0.9642, 1.0, 0.8249)
#: Display P3 colorants adapted to D50 (as in Apple's "Display P3" profile).
DISPLAY_P3 = ((0.5151, 0.2412, -0.0011), (0.2919, 0.6922, 0.0419), (0.1571, 0.0666, 0.7841))


def _s15(value: float) -> bytes:
    return struct.pack(">i", round(value * 65536))


def _xyz(xyz: tuple[float, float, float]) -> bytes:
    return b"XYZ \0\0\0\0" + b"".join(_s15(v) for v in xyz)


def _curve(gamma: float) -> bytes:
    return b"curv\0\0\0\0" + struct.pack(">IH", 1, round(gamma * 256)) + b"\0\0"


def _desc(text: str) -> bytes:
    ascii_text = text.encode("ascii") + b"\0"
    body = (b"desc\0\0\0\0" + struct.pack(">I", len(ascii_text)) + ascii_text
            + struct.pack(">II", 0, 0) + struct.pack(">HB", 0, 0) + b"\0" * 67)
    return body + b"\0" * (-len(body) % 4)


def _text(text: str) -> bytes:
    body = b"text\0\0\0\0" + text.encode("ascii") + b"\0"
    return body + b"\0" * (-len(body) % 4)


def rgb_profile(description: str = "Test Display P3", colorants=DISPLAY_P3, gamma: float = 2.2) -> bytes:
    """An RGB display profile with the given D50 colorants and a pure gamma curve."""
    red, green, blue = colorants
    tags = [(b"desc", _desc(description)), (b"cprt", _text("No copyright, test data")),
            (b"wtpt", _xyz(D50)), (b"rXYZ", _xyz(red)), (b"gXYZ", _xyz(green)),
            (b"bXYZ", _xyz(blue)), (b"rTRC", _curve(gamma)), (b"gTRC", _curve(gamma)),
            (b"bTRC", _curve(gamma))]
    table_size = 4 + 12 * len(tags)
    offset = 128 + table_size
    table, data = [struct.pack(">I", len(tags))], []
    for signature, body in tags:
        table.append(signature + struct.pack(">II", offset, len(body)))
        data.append(body)
        offset += len(body)
    size = offset
    header = (struct.pack(">I", size) + b"lcms" + struct.pack(">I", 0x02100000) + b"mntr"
              + b"RGB " + b"XYZ " + struct.pack(">6H", 2024, 1, 1, 0, 0, 0) + b"acsp"
              + b"\0" * 4 + struct.pack(">I", 0) + b"\0" * 8 + b"\0" * 8 + struct.pack(">I", 0)
              + b"".join(_s15(v) for v in D50) + b"\0" * 4 + b"\0" * 44)
    assert len(header) == 128, len(header)
    return header + b"".join(table) + b"".join(data)
