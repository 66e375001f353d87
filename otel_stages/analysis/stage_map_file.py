"""Stage map files: the format, the parsed map and its loading (no I/O beyond reading the file).

Applying a map to spans is :mod:`otel_stages.analysis.stage_map`, which re-exports these names.

File format (every key but ``about``/``layout`` required)::

    name: triton                  # shown in the report
    about: one line on what this maps
    request: InferRequest         # span name, or a list of names: each such span is one request
    label: triton.model_name      # optional: the attribute naming whose time a stage is (below)
    layout: end                   # attribute stages: laid back to back ending at the request's
                                  # end (``end``, the default) or starting at its start (``start``)
    stages:                       # in pipeline order; a stage name may repeat (times add up)
      - {stage: queue, from_event: QUEUE_START, to_event: COMPUTE_START}  # between two events
      - {stage: forward, span: compute}                                   # a whole span
      - {stage: queue, attribute: gen_ai.latency.time_in_queue, unit: s}  # a duration attribute
      - {stage: forward, attribute: gen_ai.latency.e2e, minus: gen_ai.latency.time_to_first_token}
      - {stage: api_server, rest: true}   # the request time the attribute stages leave

Any entry may add ``advice: TEXT``: what the server's user can do when that stage is the
verdict's (the report's own advice for a stage without a standard cause is to time its
sub-steps with ``stage()`` spans, which a server's user cannot add); entries of one stage name
share it (the first given wins). Stage names the report's tables use for their own rows are
refused: ``request``, ``total``, ``unaccounted`` and any name in parentheses.

``label`` (optional) names an attribute read on the span holding a stage's start, or its nearest
ancestor in the request (Triton: ``triton.model_name`` on the model span above ``compute``). Each
stage span carries it, and the report lists each stage's time per label value. A ``span`` or
``from_event`` entry may add ``when: REGEX`` (searched in the label, case-insensitive): it then
takes only the spans or event pairs whose label matches, and an entry with the same span or
events and no ``when`` takes the rest; of several ``when`` entries with one source, the first
that matches wins. The built-in ``triton`` map sends a composing model named as preprocessing to
``preprocess`` this way, not to ``forward``.

A server whose versions write different attributes gets ``variants`` instead of ``stages``: a
list of ``{name, about, layout, stages}``, tried in order for each request; the first whose
attribute stages all find their attributes (and that gives a stage) maps it. The built-in
``vllm`` map has one for vLLM's V1 engine and one for its V0 engine.

Where each kind looks, inside one request (the request span and every span below it):

- ``from_event`` / ``to_event``: every span holding ``from_event`` starts a stage at that event;
  it ends at the first ``to_event`` at or after it on the same span or on one of its direct
  children that does not hold ``from_event`` itself (Triton records ``COMPUTE_START`` on the
  ``compute`` child of the model span that holds ``QUEUE_START``; a nested model's own events
  never close its parent's). A ``from_event`` without its ``to_event``, on a span with no
  child holding ``from_event`` (a Triton ensemble's span has no ``COMPUTE_START``: its steps'
  spans hold the pairs), is a step that started and never finished: the request's stage times
  are unknown, so the request is left out of the timings (neither warm nor failed) and counted
  in a problem, with the rule's ``unfinished`` text saying what that means for the server
  (Triton: cancelled or timed out in the queue, or answered from its response cache, for which
  it records no event and sets no span status, so the trace cannot tell a failure from a hit).
- ``span``: every span of that name becomes the stage (its start and end).
- ``attribute``: a number on the request span, in ``unit`` (``s``, ``ms``, ``us``, ``ns``), less
  the ``minus`` attribute(s) where given (vLLM V0 has only times since arrival, so its prefill is
  ``time_to_first_token - time_in_queue``). Every attribute stage of a variant is required: a
  request without one of them (or with a negative duration) does not match the variant, because
  the missing time would silently land in the ``rest`` stage. A request no variant matches is
  left out and counted in a problem naming the missing attributes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from otel_stages import semconv

#: Built-in maps, by the name ``--stage-map`` takes (files in ``otel_stages/data/stage_maps``).
BUILTIN: tuple[str, ...] = ("triton", "vllm")
#: Nanoseconds per unit of an ``attribute`` stage.
UNIT_NS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
LAYOUTS: tuple[str, ...] = ("end", "start")
#: Stage names a map may not give: the request span's own name and the rows the report's tables
#: add (``total``; ``unaccounted``, the untraced-time candidate of the verdict's ranking; names in
#: parentheses such as ``(unaccounted)`` and ``(overlap)`` are refused too).
RESERVED_STAGE_NAMES: tuple[str, ...] = (semconv.SPAN_REQUEST, "total", "unaccounted")

_MAP_KEYS = {"name", "about", "request", "layout", "stages", "variants", "label"}
_VARIANT_KEYS = {"name", "about", "layout", "stages"}
_RULE_KEYS = {"stage", "span", "from_event", "to_event", "attribute", "minus", "unit", "rest",
              "unfinished", "when", "advice"}


class StageMapError(ValueError):
    """A stage map that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class StageRule:
    """One ``stages`` entry: exactly one of ``span``, ``from_event``+``to_event``, ``attribute``
    (with ``unit`` and optional ``minus``) or ``rest`` is set. ``unfinished`` (with
    ``from_event``) says what a ``from_event`` without its ``to_event`` means."""

    stage: str
    span: str | None = None
    from_event: str | None = None
    to_event: str | None = None
    attribute: str | None = None
    minus: tuple[str, ...] = ()
    unit: str = "s"
    rest: bool = False
    unfinished: str = ""
    #: a regular expression (searched, case-insensitive) the map's ``label`` must match
    when: str | None = None
    #: what the server's user can do when this stage is the verdict's (the report's generic
    #: advice assumes code the user instruments: ``stage()`` spans)
    advice: str = ""

    def matches(self, label: str | None) -> bool:
        """Whether a span or event pair labelled ``label`` is this rule's (always without
        ``when``)."""
        return self.when is None or (label is not None
                                     and re.search(self.when, label, re.IGNORECASE) is not None)

    def source(self) -> str:
        """Where this stage's time comes from, for ``semconv.STAGE_MAP_SOURCE``."""
        when = f" where label ~ {self.when}" if self.when else ""
        if self.span:
            return f"span {self.span}{when}"
        if self.from_event:
            return f"events {self.from_event} -> {self.to_event}{when}"
        if self.attribute:
            less = "".join(f" - {m}" for m in self.minus)
            return f"attribute {self.attribute}{less} ({self.unit})"
        return "request time outside the other stages"

    def attributes(self) -> tuple[str, ...]:
        """The request-span attributes this rule reads (empty unless an ``attribute`` stage)."""
        return (self.attribute, *self.minus) if self.attribute else ()


@dataclass(frozen=True)
class Variant:
    """One way the server writes its spans: ``stages`` (pipeline order) laid out by ``layout``."""

    name: str
    stages: tuple[StageRule, ...]
    layout: str = "end"
    about: str = ""


@dataclass(frozen=True)
class StageMap:
    """A parsed stage map (see the module docstring): one or more :class:`Variant`, tried in
    order per request. A map written with plain ``stages`` has one variant named after it."""

    name: str
    request: frozenset[str]
    variants: tuple[Variant, ...]
    about: str = ""
    #: the attribute naming the unit a stage's time belongs to (Triton: ``triton.model_name``),
    #: read on the span holding the stage's start or its nearest ancestor in the request
    label: str | None = None

    def attribute_keys(self) -> frozenset[str]:
        """The attributes the map reads (a loader must keep them): the request-span attributes
        of the ``attribute`` stages, and the ``label``."""
        keys = {a for v in self.variants for r in v.stages for a in r.attributes()}
        return frozenset(keys | ({self.label} if self.label else set()))

    def advice_for(self, stage: str) -> str:
        """The first ``advice`` of an entry of ``stage`` (any variant), or ``""``."""
        return next((r.advice for v in self.variants for r in v.stages
                     if r.stage == stage and r.advice), "")

    def sources_of(self, stage: str) -> list[str]:
        """Where ``stage``'s time comes from (:meth:`StageRule.source` of each of its entries)."""
        return list(dict.fromkeys(r.source() for v in self.variants for r in v.stages
                                  if r.stage == stage))

    def stage_order(self) -> tuple[str, ...]:
        """The stage names in the map's order (first appearance over the variants), for the
        report's tables."""
        return tuple(dict.fromkeys(r.stage for v in self.variants for r in v.stages))


# --- loading ---------------------------------------------------------------------------------------


def load_stage_map(name_or_path: str) -> StageMap:
    """A built-in map by name (:data:`BUILTIN`) or a YAML/JSON file. Raises :class:`StageMapError`
    naming the file and what is wrong (unreadable, not YAML, a missing or unknown key)."""
    if name_or_path in BUILTIN:
        ref = resources.files("otel_stages") / "data" / "stage_maps" / f"{name_or_path}.yaml"
        return parse_stage_map(ref.read_text(encoding="utf-8"), where=f"built-in map {name_or_path}")
    path = Path(name_or_path)
    if not path.is_file():
        raise StageMapError(
            f"{name_or_path}: no such stage map file (built-in maps: {', '.join(BUILTIN)})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StageMapError(f"{path}: cannot read ({exc})") from None
    return parse_stage_map(text, where=str(path))


def parse_stage_map(text: str, *, where: str = "stage map") -> StageMap:
    """Parse a stage map's YAML (or JSON, which YAML reads too). Raises :class:`StageMapError`."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise StageMapError(f"{where}: not YAML or JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise StageMapError(f"{where}: expected a mapping with name, request and stages")
    unknown = set(doc) - _MAP_KEYS
    if unknown:
        raise StageMapError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise StageMapError(f"{where}: 'name' must be a non-empty string")
    request = doc.get("request")
    names = [request] if isinstance(request, str) else request
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise StageMapError(f"{where}: 'request' must be a span name or a list of span names")
    layout = _layout(doc.get("layout", "end"), where)
    if ("stages" in doc) == ("variants" in doc):
        raise StageMapError(f"{where}: give either 'stages' or 'variants' (a list of stage lists)")
    if "stages" in doc:
        variants: tuple[Variant, ...] = (
            Variant(name.strip(), _rules(doc.get("stages"), where), layout),)
    else:
        variants = _variants(doc.get("variants"), layout, where)
    about = doc.get("about", "")
    label = doc.get("label")
    if label is not None and not (isinstance(label, str) and label.strip()):
        raise StageMapError(f"{where}: 'label' must be an attribute name")
    if label is None and any(r.when for v in variants for r in v.stages):
        raise StageMapError(f"{where}: 'when' needs a map-level 'label' (the attribute it matches)")
    return StageMap(name.strip(), frozenset(names), variants, str(about or ""),
                    None if label is None else label.strip())


def _layout(layout: Any, where: str) -> str:
    if layout not in LAYOUTS:
        raise StageMapError(f"{where}: 'layout' must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return str(layout)


def _variants(raw: Any, layout: str, where: str) -> tuple[Variant, ...]:
    if not isinstance(raw, list) or not raw:
        raise StageMapError(f"{where}: 'variants' must be a non-empty list")
    out: list[Variant] = []
    for i, item in enumerate(raw):
        here = f"{where}: variants[{i}]"
        if not isinstance(item, Mapping):
            raise StageMapError(f"{here}: expected a mapping with name and stages")
        unknown = set(item) - _VARIANT_KEYS
        if unknown:
            raise StageMapError(f"{here}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise StageMapError(f"{here}: 'name' must be a non-empty string")
        if any(v.name == name.strip() for v in out):
            raise StageMapError(f"{here}: variant name {name.strip()!r} is used twice")
        rules = _rules(item.get("stages"), here)
        about = item.get("about", "")
        out.append(Variant(name.strip(), rules, _layout(item.get("layout", layout), here),
                           str(about or "")))
    return tuple(out)


def _rules(raw: Any, where: str) -> tuple[StageRule, ...]:
    if not isinstance(raw, list) or not raw:
        raise StageMapError(f"{where}: 'stages' must be a non-empty list")
    rules = tuple(_rule(item, f"{where}: stages[{i}]") for i, item in enumerate(raw))
    if sum(r.rest for r in rules) > 1:
        raise StageMapError(f"{where}: at most one stage may be 'rest: true'")
    return rules


def _rule(item: Any, where: str) -> StageRule:
    if not isinstance(item, Mapping):
        raise StageMapError(f"{where}: expected a mapping such as {{stage: queue, span: wait}}")
    unknown = set(item) - _RULE_KEYS
    if unknown:
        raise StageMapError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    stage = item.get("stage")
    if not isinstance(stage, str) or not stage.strip():
        raise StageMapError(f"{where}: 'stage' must be a non-empty string")
    if stage.strip() in RESERVED_STAGE_NAMES or stage.strip().startswith("("):
        raise StageMapError(
            f"{where}: a stage cannot be named {stage.strip()!r}: the report's tables use"
            f" {', '.join(repr(n) for n in RESERVED_STAGE_NAMES)} and names in parentheses"
            " such as '(unaccounted)' for their own rows")
    kinds = [k for k in ("span", "from_event", "attribute", "rest") if item.get(k)]
    if len(kinds) != 1:
        raise StageMapError(
            f"{where}: give exactly one of span, from_event (+ to_event), attribute (+ unit) or"
            f" rest: true (got {', '.join(kinds) or 'none'})"
        )
    strings = {k: item.get(k)
               for k in ("span", "from_event", "to_event", "attribute", "unfinished", "when",
                         "advice")}
    for key, value in strings.items():
        if value is not None and not (isinstance(value, str) and value):
            raise StageMapError(f"{where}: {key!r} must be a non-empty string")
    if item.get("from_event") and not item.get("to_event"):
        raise StageMapError(f"{where}: from_event needs a to_event")
    if item.get("to_event") and not item.get("from_event"):
        raise StageMapError(f"{where}: to_event needs a from_event")
    if item.get("unfinished") and not item.get("from_event"):
        raise StageMapError(f"{where}: 'unfinished' goes with from_event")
    unit = item.get("unit", "s")
    if unit not in UNIT_NS:
        raise StageMapError(f"{where}: 'unit' must be one of {', '.join(UNIT_NS)}, not {unit!r}")
    if "unit" in item and not item.get("attribute"):
        raise StageMapError(f"{where}: 'unit' goes with 'attribute'")
    minus = item.get("minus", ())
    minus = [minus] if isinstance(minus, str) else minus
    if not isinstance(minus, (list, tuple)) or not all(isinstance(m, str) and m for m in minus):
        raise StageMapError(f"{where}: 'minus' must be an attribute name or a list of them")
    if minus and not item.get("attribute"):
        raise StageMapError(f"{where}: 'minus' goes with 'attribute'")
    rest = item.get("rest", False)
    if not isinstance(rest, bool):
        raise StageMapError(f"{where}: 'rest' must be true or false")
    when = strings["when"]
    if when is not None:
        if not (item.get("span") or item.get("from_event")):
            raise StageMapError(f"{where}: 'when' goes with span or from_event")
        try:
            re.compile(when)
        except re.error as exc:
            raise StageMapError(f"{where}: 'when' is not a regular expression ({exc})") from None
    return StageRule(
        stage=stage.strip(),
        span=strings["span"],
        from_event=strings["from_event"],
        to_event=strings["to_event"],
        attribute=strings["attribute"],
        minus=tuple(minus),
        unit=unit,
        rest=rest,
        unfinished=strings["unfinished"] or "",
        when=when,
        advice=strings["advice"] or "",
    )
