"""URLs as otel_stages records them: secrets redacted, ``data:`` URLs summarised, messages
scrubbed (pure functions; no OpenTelemetry import).

Redaction follows the OpenTelemetry HTTP semantic conventions for ``url.full`` (user and
password become ``REDACTED``; the values of the query keys ``AWSAccessKeyId``, ``Signature``,
``sig`` and ``X-Goog-Signature`` become ``REDACTED``) and goes further: any query or fragment
parameter whose name is in :data:`SENSITIVE_QUERY_KEYS`, ends with one of
:data:`SENSITIVE_SUFFIXES` (``...token``, ``...secret``, ``...password``, ``...signature``,
``...credential``, ``...api_key``), or was added with the ``redact_query_keys`` setting
(``OTEL_STAGES_REDACT_QUERY_KEYS``). Names compare case-insensitively. A URL that does not parse
is redacted by pattern instead, never returned as is.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import urllib.parse
from dataclasses import dataclass

from otel_stages.attributes import cap

REDACTED = "REDACTED"

#: Query parameter names (lower case) whose values are secrets: the OpenTelemetry list, cloud
#: signed-URL parameters and common bearer names.
SENSITIVE_QUERY_KEYS = frozenset({
    # OpenTelemetry semantic conventions (url.full)
    "awsaccesskeyid", "signature", "sig", "x-goog-signature",
    # signed URLs: AWS SigV4, Google Cloud Storage V4
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-credential",
    # bearer names
    "token", "access_token", "refresh_token", "id_token", "api_key", "apikey", "api-key", "key",
    "password", "passwd", "pwd", "secret", "client_secret", "auth", "authorization",
})
#: Name endings that mark a secret (e.g. ``sessionToken``, ``db_password``, ``x-api-key``).
SENSITIVE_SUFFIXES = ("token", "secret", "password", "passwd", "signature", "credential",
                      "credentials", "apikey", "api_key", "api-key", "access_key", "accesskey",
                      "private_key")
_MIN_SCRUB = 3  # shorter values are not worth mangling a message for (and are no real secret)


def _extra_from_env() -> frozenset[str]:
    raw = os.environ.get("OTEL_STAGES_REDACT_QUERY_KEYS", "")
    return frozenset(k.strip().lower() for k in raw.split(",") if k.strip())


_extra_keys = _extra_from_env()


def set_extra_sensitive_keys(keys: tuple[str, ...] | frozenset[str]) -> None:
    """Add ``keys`` to the built-in list (``configure()`` calls this with the setting)."""
    global _extra_keys
    _extra_keys = frozenset(k.lower() for k in keys)


def is_sensitive_key(name: str) -> bool:
    """True when a query parameter called ``name`` carries a secret (see the module docstring)."""
    key = name.strip().lower()
    return key in SENSITIVE_QUERY_KEYS or key in _extra_keys or key.endswith(SENSITIVE_SUFFIXES)


def _redact_params(raw: str) -> str:
    """``a=1&token=x`` -> ``a=1&token=REDACTED``; every other byte of ``raw`` is kept as is."""
    if "=" not in raw:
        return raw
    parts = []
    for piece in raw.split("&"):
        name, sep, _value = piece.partition("=")
        if sep and is_sensitive_key(urllib.parse.unquote_plus(name)):
            piece = f"{name}={REDACTED}"
        parts.append(piece)
    return "&".join(parts)


_USERINFO = re.compile(r"(?<=//)[^/?#@\s]*@")
_PARAM = re.compile(r"([?&#;])([^=&#;\s]+)=([^&#;\s]*)")


def _redact_by_pattern(url: str) -> str:
    url = _USERINFO.sub(f"{REDACTED}:{REDACTED}@", url, count=1)
    return _PARAM.sub(lambda m: (f"{m[1]}{m[2]}={REDACTED}" if is_sensitive_key(
        urllib.parse.unquote_plus(m[2])) else m[0]), url)


def redact_url(url: str) -> str:
    """``url`` for telemetry and messages: credentials and secret query/fragment values replaced
    by ``REDACTED``, a ``data:`` URL replaced by its summary (:func:`describe_data_url`), and
    the result capped (:func:`otel_stages.attributes.cap`)."""
    if url[:5].lower() == "data:":
        return describe_data_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
    except ValueError:  # e.g. an unbalanced IPv6 bracket: redact by pattern instead
        return cap(_redact_by_pattern(url))
    if "@" in netloc:
        netloc = f"{REDACTED}:{REDACTED}@" + netloc.rsplit("@", 1)[1]
    shown = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, _redact_params(parts.query),
                                     _redact_params(parts.fragment)))
    return cap(shown)


def url_secrets(url: str) -> list[str]:
    """The secret strings inside ``url`` (user, password, sensitive parameter values; raw and
    percent-decoded), longest first, for :func:`scrub`."""
    found: set[str] = set()
    try:
        parts = urllib.parse.urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
        params = f"{parts.query}&{parts.fragment}"
    except ValueError:
        match = _USERINFO.search(url)
        userinfo = match[0][:-1] if match else ""
        params = url
    for piece in userinfo.split(":") if userinfo else ():
        found.update({piece, urllib.parse.unquote(piece)})
    for match in _PARAM.finditer("&" + params):
        if is_sensitive_key(urllib.parse.unquote_plus(match[2])):
            found.update({match[3], urllib.parse.unquote_plus(match[3])})
    return sorted((s for s in found if len(s) >= _MIN_SCRUB), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every string in ``secrets`` replaced by ``REDACTED``."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


@dataclass(frozen=True)
class DataUrl:
    """A parsed ``data:`` URL (RFC 2397): ``media_type`` (default ``text/plain``), whether the
    payload is ``base64``, and the payload text as written (``payload_chars`` long)."""

    media_type: str
    base64: bool
    payload: str

    @property
    def payload_chars(self) -> int:
        """Characters of payload text in the URL."""
        return len(self.payload)

    def estimated_bytes(self) -> int:
        """Decoded size, from the text length alone (exact for valid base64)."""
        if self.base64:
            text = self.payload.rstrip("=")
            return len(text) * 3 // 4
        return len(self.payload)

    def decode(self) -> bytes:
        """The payload bytes. Raises ``ValueError`` naming what is wrong (never the content)."""
        if not self.base64:
            return urllib.parse.unquote_to_bytes(self.payload)
        text = "".join(self.payload.split())  # line breaks are tolerated in practice
        text = urllib.parse.unquote(text) if "%" in text else text
        try:
            return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"the base64 payload ({len(text)} chars) is not valid base64") from None


def parse_data_url(url: str) -> DataUrl:
    """Split ``data:[<media type>][;base64],<payload>``. Raises ``ValueError`` when there is no
    comma (the message never contains the payload)."""
    head, comma, payload = url[5:].partition(",")
    if not comma:
        raise ValueError(f"data: URL without a ',' before the payload ({len(url)} chars)")
    params = [p.strip() for p in head.split(";")]
    is_base64 = bool(params) and params[-1].lower() == "base64"
    if is_base64:
        params = params[:-1]
    media_type = params[0].lower() if params and "/" in params[0] else "text/plain"
    return DataUrl(cap(media_type, 255), is_base64, payload)


def describe_data_url(url: str) -> str:
    """What telemetry records instead of a ``data:`` URL: scheme, media type, encoding and
    length, e.g. ``data:image/png;base64,[2000000 chars]``."""
    try:
        parsed = parse_data_url(url)
    except ValueError:
        return f"data:[{len(url) - 5} chars, malformed]"
    encoding = ";base64" if parsed.base64 else ""
    return f"data:{parsed.media_type}{encoding},[{parsed.payload_chars} chars]"
