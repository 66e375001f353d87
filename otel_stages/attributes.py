"""Attribute values as OpenTelemetry accepts them, and bounded (OpenTelemetry API only).

Every attribute, status message and exception message otel_stages writes goes through here:

* ``str`` / ``bool`` / ``int`` / ``float`` pass unchanged (the fast path: one type check each);
  a string longer than the limit is cut and ends with a visible marker that gives the original
  length, e.g. ``"aaaa…[truncated, 2000022 chars]"``, so the result is at most the limit;
* numpy scalars (and 0-d arrays) become Python ``int`` / ``float`` / ``bool``; 1-d arrays, tuples
  and lists become homogeneous lists (ints mixed with floats become floats; anything mixed with
  strings becomes strings); a sequence of more than :data:`MAX_SEQUENCE_ITEMS` items, or an
  array of more than one dimension, becomes a one-line description instead of a list;
* ``bytes`` (and ``bytearray`` / ``memoryview``) and the values of prompt keys (``prompt``,
  ``*.prompt``, ``*_prompt``) are never recorded: only their length and a short SHA-256;
* ``None`` values are left out (an attribute with no value); other objects are recorded as
  ``str(value)``, capped.

No per-call warnings: the SDK never sees a value it would have to reject or cut.

The limit is :func:`value_length_limit` characters: the ``attribute_value_length_limit`` setting,
i.e. ``OTEL_STAGES_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else the standard
``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` / ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else 4096.
``configure()`` sets it from its settings; without ``configure()`` it is read from the
environment at import.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import traceback
from collections.abc import Mapping
from typing import Any

from otel_stages import semconv

DEFAULT_VALUE_LENGTH_LIMIT = 4096  #: characters
#: Sequences longer than this become a description instead of a list (attributes are for labels,
#: shapes and small id lists, not data).
MAX_SEQUENCE_ITEMS = 128
#: Environment variables consulted for the limit, highest priority first.
LIMIT_ENV = ("OTEL_STAGES_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
             "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
_HASH_HEX = 16  # characters of the SHA-256 shown for values that are not recorded


def _limit_from_env() -> int:
    for var in LIMIT_ENV:
        raw = os.environ.get(var, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return DEFAULT_VALUE_LENGTH_LIMIT


_limit = _limit_from_env()


def value_length_limit() -> int:
    """The current cap, in characters, for string values, status and exception messages."""
    return _limit


def set_value_length_limit(limit: int) -> None:
    """Set the cap (``configure()`` calls this with the resolved setting). ``limit`` >= 1."""
    global _limit
    if limit < 1:
        raise ValueError(f"attribute value length limit must be >= 1, got {limit}")
    _limit = limit


def cap(text: str, limit: int | None = None) -> str:
    """``text`` if it fits in ``limit`` characters (default :func:`value_length_limit`), else its
    head plus ``"…[truncated, N chars]"`` (N = the original length), at most ``limit`` long.
    Below the marker's own length the text is simply cut."""
    limit = _limit if limit is None else limit
    if len(text) <= limit:
        return text
    marker = f"…[truncated, {len(text)} chars]"
    if limit <= len(marker):
        return text[:limit]
    return text[:limit - len(marker)] + marker


def cap_tail(text: str, limit: int | None = None) -> str:
    """Like :func:`cap` but keeps the *end* (for tracebacks: the innermost frames and the
    message matter most): ``"[truncated, N chars]…" + tail``."""
    limit = _limit if limit is None else limit
    if len(text) <= limit:
        return text
    marker = f"[truncated, {len(text)} chars]…"
    if limit <= len(marker):
        return text[-limit:]
    return marker + text[len(text) - (limit - len(marker)):]


def _not_recorded(size: int, unit: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()[:_HASH_HEX]
    return f"[not recorded: {size} {unit}, sha256 {digest}]"


_PROMPT_SUFFIXES = (".prompt", "_prompt")


def is_prompt_key(key: str) -> bool:
    """Keys whose values are prompts, recorded only as length and hash."""
    return key == "prompt" or key.endswith(_PROMPT_SUFFIXES)


def clean_attributes(attributes: Mapping[str, Any]) -> Mapping[str, Any]:
    """``attributes`` ready for the SDK: the same mapping when every value is already a plain
    ``str`` within the limit (not under a prompt key), ``bool``, ``int`` or ``float`` (no copy);
    else a new dict with each value cleaned (see the module docstring). Never raises for a
    value: one that cannot be described at all is left out."""
    limit = _limit
    for key, value in attributes.items():
        kind = type(value)
        if kind is str:
            if len(value) > limit or "prompt" in key:  # the slow path tells prompt keys apart
                break
        elif kind is not int and kind is not float and kind is not bool:
            break
    else:
        return attributes
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        cleaned = clean_value(value, limit, key=key)
        if cleaned is not None:
            out[key] = cleaned
    return out


def clean_value(value: Any, limit: int | None = None, *, key: str = "") -> Any:
    """One attribute value as the SDK accepts it (see the module docstring); ``None`` = leave
    the attribute out. ``key`` is used only to recognise prompt keys."""
    limit = _limit if limit is None else limit
    if key and is_prompt_key(key) and isinstance(value, str):
        return _not_recorded(len(value), "chars", value.encode("utf-8", "surrogatepass"))
    scalar = _scalar(value, limit)
    if scalar is not _NOT_SCALAR:
        return scalar
    if isinstance(value, Mapping):
        return {str(k): v for k, v in ((k, clean_value(v, limit)) for k, v in value.items())
                if v is not None}
    ndim = getattr(value, "ndim", None)
    if ndim is not None and hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy array
        size = int(getattr(value, "size", 0))
        if ndim == 0:
            return _scalar(value.item(), limit)
        if ndim > 1 or size > MAX_SEQUENCE_ITEMS:
            return cap(f"[ndarray {value.dtype} shape {tuple(value.shape)}: {size} items, "
                       "not recorded]", limit)
        return _homogeneous(value.tolist(), limit)
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_SEQUENCE_ITEMS:
            return cap(f"[{type(value).__name__} of {len(value)} items, not recorded]", limit)
        return _homogeneous(list(value), limit)
    try:
        return cap(str(value), limit)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the stage
        return None


class _NotScalar:
    pass


_NOT_SCALAR: Any = _NotScalar()


def _scalar(value: Any, limit: int) -> Any:
    """A plain scalar for ``value`` (``None`` stays ``None``), or ``_NOT_SCALAR``."""
    if value is None:
        return None
    if isinstance(value, str):
        return cap(str.__str__(value), limit)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return _not_recorded(len(data), "bytes", data)
    if isinstance(value, numbers.Integral):  # int subclasses and numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # float subclasses and numpy floats
        return float(value)
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", None) == 0 and hasattr(value, "dtype"):
        plain = item()  # numpy bool_ and other 0-d numpy values
        if isinstance(plain, (bool, int, float, str)):
            return _scalar(plain, limit)
    return _NOT_SCALAR


def _homogeneous(items: list[Any], limit: int) -> list[Any]:
    """A list of one element type, as OpenTelemetry requires (``None`` elements kept)."""
    cleaned = []
    for item in items:
        scalar = _scalar(item, limit)
        if scalar is _NOT_SCALAR:
            scalar = cap(str(item), limit)
        cleaned.append(scalar)
    kinds = {type(v) for v in cleaned if v is not None}
    if len(kinds) <= 1:
        return cleaned
    if kinds <= {int, float}:
        return [None if v is None else float(v) for v in cleaned]
    return [None if v is None else cap(str(v), limit) for v in cleaned]


def exception_attributes(exc: BaseException, limit: int | None = None) -> dict[str, str]:
    """``exception.message`` and ``exception.stacktrace`` for an exception event, capped:
    the message keeps its head, the stack trace keeps its end (innermost frames and the final
    message; each line of a long message in it is capped too). Pass to
    ``span.record_exception(exc, attributes=...)``, which otherwise records both in full."""
    limit = _limit if limit is None else limit
    try:
        message = str(exc)
    except Exception as error:  # noqa: BLE001 - an exception whose __str__ fails
        message = f"<str() failed: {type(error).__name__}>"
    line_limit = max(1, limit // 4)
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    stacktrace = "".join(cap(line, line_limit) for line in lines)
    return {semconv.EXCEPTION_MESSAGE: cap(message, limit),
            semconv.EXCEPTION_STACKTRACE: cap_tail(stacktrace, limit)}


def status_message(exc: BaseException, limit: int | None = None) -> str:
    """``"<type>: <message>"`` for a span status, capped."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception as error:  # noqa: BLE001
        text = f"{type(exc).__name__}: <str() failed: {type(error).__name__}>"
    return cap(text, limit)
