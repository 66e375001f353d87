"""Keep loaded records small: one string per trace id, parent id, span name and attribute key, one
dict per distinct resource, and only the attributes a :class:`~otel_stages.analysis.selection.Selection`
keeps.

A parsed JSON document gives every span its own copy of each of those strings (a trace id is
repeated on all spans of the trace, ``"download"`` on every download span); at a million spans the
copies alone are over 200 MB. A :class:`Compactor` lives for one load (its caches are dropped with
it) and collects what the loaders produce into :attr:`Compactor.out`.
"""

from __future__ import annotations

import gc
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from otel_stages.analysis.model import (
    AttributeValue,
    MetricPoint,
    Recording,
    Span,
    SpanEvent,
)
from otel_stages.analysis.selection import ALL, Selection

#: String attribute values up to this long are shared (``"JPEG"``, ``"RGB"``, ``"image/jpeg"``);
#: longer ones are mostly unique (URLs, ids) and sharing them would only grow the cache.
SHARED_VALUE_MAX_CHARS = 16
#: Distinct attribute sets shared per load (:attr:`Compactor.attribute_sets`); past this many,
#: new sets get dicts of their own (the values are unique, sharing would not pay).
MAX_ATTRIBUTE_SETS = 1 << 16
#: The one attributes dict of every loaded record without attributes (read-only, like all).
NO_ATTRIBUTES: dict[str, AttributeValue] = {}


class KeyCache(dict[str, str]):
    """``cache[key]`` returns the one shared copy of ``key`` (added on first use)."""

    def __missing__(self, key: str) -> str:
        if type(key) is not str:
            raise KeyError(key)
        self[key] = key
        return key


class Compactor:
    """Shares strings and resource dicts between the records of one load and applies the
    selection; appends everything to :attr:`out`.

    ``trace_ids``, ``parent_ids``, ``names`` and ``values`` are plain ``dict`` caches
    (``cache.setdefault(s, s)`` returns the shared copy); ``keys`` maps a kept attribute key to
    its shared copy (``keys.get(k)`` is ``None`` for a key the selection drops; with :data:`ALL`
    it is a :class:`KeyCache`, so use :meth:`key_lookup`).

    ``attribute_sets`` shares whole attribute dicts: ``(k1, v1, k2, v2...)`` -> the one dict with
    those items. Selected attributes repeat across spans (every forward span's ``batch.size: 1``,
    every decode span of one input's ``image.*``), and a small dict costs more than the span
    record. Only sets whose values are all ``str`` or ``int`` are shared: tuples compare ``1``,
    ``1.0`` and ``True`` equal, and a shared dict must hold the very values its span had.
    """

    def __init__(self, selection: Selection = ALL, out: Recording | None = None) -> None:
        self.selection = selection
        self.out = Recording() if out is None else out
        self.trace_ids: dict[str, str] = {}
        self.parent_ids: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.values: dict[str, str] = {}
        self._resources: dict[Hashable, dict[str, AttributeValue]] = {}
        self.attribute_sets: dict[tuple[Any, ...], dict[str, AttributeValue]] = {}
        if selection.attributes is None:
            self.keys: dict[str, str] = KeyCache()
        else:
            self.keys = {k: k for k in selection.attributes}

    def key_lookup(self, key: Any) -> str | None:
        """The shared copy of attribute key ``key``, or ``None`` when the selection drops it."""
        try:
            return self.keys[key] if self.selection.attributes is None else self.keys.get(key)
        except (KeyError, TypeError):
            return None

    def resource(self, attributes: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
        """The shared dict equal to ``attributes`` (resource attributes are kept in full)."""
        try:
            key: Hashable = tuple(attributes.items())
            return self._resources.setdefault(key, attributes)
        except TypeError:  # a list or dict value: not shared, still correct
            return attributes

    def attributes(self, attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
        """The selected attributes, with shared keys, short string values and (see the class
        docstring) shared dicts."""
        items: list[Any] = []
        shareable = True
        values = self.values
        for key, value in attributes.items():
            shared = self.key_lookup(key)
            if shared is not None:
                kind = type(value)
                if kind is str:
                    if len(value) <= SHARED_VALUE_MAX_CHARS:
                        value = values.setdefault(value, value)
                elif kind is not int:
                    shareable = False
                items += (shared, value)
        if not items:
            return NO_ATTRIBUTES
        pairs = iter(items)
        if not shareable:
            return dict(zip(pairs, pairs))
        shape = tuple(items)
        found = self.attribute_sets.get(shape)
        if found is None:
            found = dict(zip(pairs, pairs))
            if len(self.attribute_sets) < MAX_ATTRIBUTE_SETS:
                self.attribute_sets[shape] = found
        return found

    def events(self, events: tuple[SpanEvent, ...]) -> tuple[SpanEvent, ...]:
        """``events`` with their attributes selected."""
        if not events:
            return ()
        return tuple(
            SpanEvent(self.names.setdefault(e.name, e.name), e.time_ns, self.attributes(e.attributes))
            for e in events
        )

    def span(self, span: Span) -> Span:
        """A compact copy of a span a loader built (equal to it when nothing is dropped)."""
        parent = span.parent_span_id
        return Span(
            self.trace_ids.setdefault(span.trace_id, span.trace_id),
            self.parent_ids.get(span.span_id, span.span_id),
            None if parent is None else self.parent_ids.setdefault(parent, parent),
            self.names.setdefault(span.name, span.name),
            span.start_ns,
            span.end_ns,
            self.attributes(span.attributes),
            self.resource(span.resource),
            span.error,
            self.events(span.events),
            span.parent_follows_from,
            span.links,
        )

    def add(self, recording: Recording) -> None:
        """Append a loader's spans (compacted), points (resources shared) and problems."""
        out = self.out
        out.spans.extend(self.span(s) for s in recording.spans)
        out.metrics.extend(
            MetricPoint(p.name, p.time_ns, p.value, p.attributes, self.resource(p.resource),
                        p.unit if p.unit is None else self.names.setdefault(p.unit, p.unit))
            for p in recording.metrics
        )
        out.problems.extend(recording.problems)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while records are built, and restore it as it was.

    Loading and grouping make millions of objects and no reference cycles, and every automatic
    collection walks the objects made so far again: at 100 000 spans that doubled the time of
    grouping on the development host. Reference counting still frees everything at once; a cycle
    made meanwhile is collected after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
