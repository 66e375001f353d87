"""Input cohorts: requests with the same input, compared with each other (the method's "run a
fixed input"). Pure; linear in the requests (plus sorts).

A cohort key is the image ``width x height`` (pixels after EXIF orientation, from the decode
span), with the Pillow format when the recording holds more than one format, and the prompt length
bucket (powers of two, ``gen_ai.usage.input_tokens``) when any request records it:
``"1024x768"``, ``"1024x768 PNG"``, ``"1024x768, prompt 16-31 tokens"``. Requests without any of
these have no key.

- :func:`cold_figures`: the cold request compared with warm requests of its own cohort when at
  least :data:`COMPARABLE_MIN_REQUESTS` exist, else with all warm requests (and it says so). A
  request of several decode spans has the images they decoded as part of its input there
  (:func:`decoded_images`): only warm requests that decoded the same images are its cohort.
- :func:`find_set_apart`: models that tune kernels per input shape (cuDNN autotuning,
  ``torch.compile`` with dynamic shapes, TensorRT profiles) pay again on the first request of each
  new shape, and a warm process can go cold after a long idle period. The first request of each
  cohort in a process (when the process's start is in the recording; not one of several decode
  spans, whose cohort is only its first image's) and requests after an idle
  gap of :data:`IDLE_GAP_MIN_S` are set apart from the warm runs when they stand out:
  ``COLD_START_MIN_RATIO`` times the median of the other warm requests of their cohort (that
  decoded the same images, :func:`decoded_images`) or more.
  So is the first successful request after a failed first request (a crash during model load):
  the cold start may have moved to it. And the warm-up: lazy compilation and autotuning can take
  several requests, not one. In a process whose start is in the recording, its first
  :data:`WARMUP_MAX_REQUESTS` warm requests after its cold one are looked at in order; the warm-up
  is those set apart consecutively from the cold one (stopping at the first that is not), each
  that no other reason flags set apart as ``warm_up`` when it took the warm-up bar
  (:func:`warm_up_min_ms`: the p95, an element of them, plus the median of its input's warm
  requests after the warm-up, the first ``WARMUP_MAX_REQUESTS`` of each started process left out)
  or more. The bar, above the warm runs' own slow ones, keeps a request in the slow mode of a
  bimodal steady forward out.
  Requests are counted from a process's first warm one: a process with that many warm requests
  before its cold one (a model reload marked later) has none looked at.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis import caveats, decision
from otel_stages.analysis.decision import COLD_START_MIN_RATIO
from otel_stages.analysis.figures import (
    ALL_WARM,
    COLD_UNTRACED,
    REASON_AFTER_FAILED_START,
    REASON_AFTER_IDLE,
    REASON_BEHIND_COLD,
    REASON_NEW_INPUT,
    REASON_WARM_UP,
    SAME_INPUT,
    ApartFigures,
    ColdFigures,
    WarmupFigures,
)
from otel_stages.analysis.requests import Request, positive_int, process_keys
from otel_stages.analysis.stats import order_stages, percentile

#: A gap this long (seconds) between a request and the previous one of its process can make a warm
#: process cold again (caches evicted, GPU clocks lowered, connections closed).
IDLE_GAP_MIN_S = 30.0

#: The warm-up after a process's cold request is looked for in at most this many warm requests
#: after it. Defined with the sentence that names it
#: (:data:`otel_stages.analysis.caveats.WARMUP_MAX_REQUESTS`, where the reason for a cap is).
WARMUP_MAX_REQUESTS = caveats.WARMUP_MAX_REQUESTS

#: The cold request is compared with warm requests of its own input when at least this many exist;
#: the same floor applies to setting requests apart. Defined with the rules
#: (:data:`otel_stages.analysis.decision.COMPARABLE_MIN_REQUESTS`, whose sentences name it).
COMPARABLE_MIN_REQUESTS = decision.COMPARABLE_MIN_REQUESTS

def _start(r: Request) -> tuple[int, str, bool, str]:
    """Requests in start order; ties (one trace's requests started in the same nanosecond: a
    fan-out at start-up) by trace id, then the cold one first, then by span id, as the ClickHouse
    report orders them."""
    return r.start_ns, r.trace_id, not r.cold, r.span_id



class CohortKeys:
    """Cohort keys for one recording (module docstring): format and prompt bucket join the key
    only when the recording varies in them, so keys stay comparable within it; where some
    requests' image sizes are known, a request without one has no key (its input is unknown)."""

    def __init__(self, requests: Iterable[Request]) -> None:
        formats: set[str] = set()
        self.sizes = False  # some request's image size is known
        self.prompts = False
        self.outputs = False  # output length (generated tokens) is part of a model's input work
        for r in requests:
            if r.image_format:
                formats.add(r.image_format)
            self.sizes = self.sizes or (r.image_width is not None and r.image_height is not None)
            self.prompts = self.prompts or r.prompt_tokens is not None
            self.outputs = self.outputs or r.output_tokens is not None
        self.formats = len(formats) > 1
        # inputs -> key: a recording has a few distinct inputs and keys are asked for per request,
        # several times over
        self._known: dict[tuple[int | None, int | None, str | None, int | None, int | None],
                          str | None] = {}

    def key(self, req: Request) -> str | None:
        """The cohort key of ``req``, or ``None`` when its input is unknown."""
        inputs = (req.image_width, req.image_height, req.image_format, req.prompt_tokens,
                  req.output_tokens)
        try:
            return self._known[inputs]
        except KeyError:
            key = self._known[inputs] = self._key(req)
            return key

    def keys(self, requests: Iterable[Request]) -> list[str | None]:
        """:meth:`key` of each request, in order (one call for a fleet's many requests)."""
        known = self._known
        out: list[str | None] = []
        for req in requests:
            inputs = (req.image_width, req.image_height, req.image_format, req.prompt_tokens,
                  req.output_tokens)
            try:
                key = known[inputs]
            except KeyError:
                key = known[inputs] = self._key(req)
            out.append(key)
        return out

    def _key(self, req: Request) -> str | None:
        if self.sizes and (req.image_width is None or req.image_height is None):
            # where images are sized, one without a size is an unknown input, not the input of
            # its prompt length alone (a decode span that lost its attributes is no new shape)
            return None
        parts = []
        if req.image_width is not None and req.image_height is not None:
            size = f"{req.image_width}x{req.image_height}"
            if self.formats:
                size += f" {req.image_format or 'unknown'}"
            parts.append(size)
        if self.prompts and req.prompt_tokens is not None:
            parts.append(f"prompt {prompt_bucket(req.prompt_tokens)} tokens")
        if self.outputs and req.output_tokens is not None:
            parts.append(f"output {prompt_bucket(req.output_tokens)} tokens")
        return ", ".join(parts) or None


def prompt_bucket(tokens: int) -> str:
    """``0`` -> ``"0"``, ``20`` -> ``"16-31"``, ``1`` -> ``"1"``: powers-of-two buckets."""
    if tokens <= 1:
        return str(max(tokens, 0))
    lo = 2 ** int(math.log2(tokens))
    return f"{lo}-{2 * lo - 1}"


def group(requests: Iterable[Request], keys: CohortKeys) -> dict[str, list[Request]]:
    """Requests by cohort key, largest cohort first (ties by key); requests without a key left out."""
    requests = requests if isinstance(requests, Sequence) else list(requests)
    out: dict[str, list[Request]] = defaultdict(list)
    for r, k in zip(requests, keys.keys(requests)):
        if k is not None:
            out[k].append(r)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def _per_stage(requests: Sequence[Request], of: Callable[[list[float]], float] = statistics.median
               ) -> dict[str, float]:
    """Each stage's median (or ``of``) over ``requests`` where it ran, then their untraced
    time's (:data:`~otel_stages.analysis.figures.COLD_UNTRACED`); empty without requests."""
    values: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        for name, ms in r.stages_ms.items():
            values[name].append(ms)
    out = {n: of(values[n]) for n in order_stages(values)}
    if requests:
        out[COLD_UNTRACED] = of([r.unaccounted_ms for r in requests])
    return out


#: An image one decode span decoded: ``(width, height)`` in pixels, each an int above 0 as the
#: request's own size is read (as the cohort key reads sizes: not the encoded bytes, which differ
#: between any two uploads of one size, so a multi-image service's cold request would meet no warm
#: one); :data:`UNKNOWN_IMAGE` for a span without both.
Image = tuple[int, int]
#: A decode span whose image cannot be told (a size missing): one unknown image in the multiset.
UNKNOWN_IMAGE: Image = (0, 0)
#: A cold request's input in the cold comparison: its cohort key and :func:`decoded_images`.
InputKey = tuple[str, "tuple[Image, ...] | None"]


def decoded_images(r: Request) -> tuple[Image, ...] | None:
    """The images ``r``'s decode spans decoded, sorted (a multiset: the order of the spans does not
    matter), :data:`UNKNOWN_IMAGE` for a span without width and height; ``None`` with at most
    one decode span. A request's cohort key is only its first image's, so a cold request that also
    decoded a 12 MP photo would otherwise meet the warm requests of its first image alone and call
    the second decode a cold start; the ClickHouse report keys the same multiset
    (``images_sig``, :mod:`otel_stages.analysis.clickhouse_requests`)."""
    images = [(positive_int(s.attributes.get(_WIDTH)), positive_int(s.attributes.get(_HEIGHT)))
              for s in r.spans if s.name == semconv.STAGE_DECODE]
    if len(images) <= 1:
        return None
    return tuple(sorted(UNKNOWN_IMAGE if None in image else image  # type: ignore[misc]
                        for image in images))


_WIDTH, _HEIGHT = semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT


def cold_figures(
    cold: Sequence[Request], warm: Sequence[Request], keys: CohortKeys, *,
    first_of_process: bool = True,
) -> ColdFigures | None:
    """The cold request(s) and what they are compared with (module docstring); ``None`` without
    cold requests. With several cold requests (several processes) times are medians; they are
    compared with the same input only when every one of them has 5+ warm requests of its input;
    when only some have, those are compared and the others left out (``left_out``).
    ``first_of_process``: false when ``request.cold_start`` marked a request that is not the first
    of its process (passed on to the figures' wording).

    A request's input here is its cohort key and, with several decode spans, the images they
    decoded (:func:`decoded_images`): a cold request that decoded a second image meets only warm
    requests that decoded the same images (a fixed two-image input keeps its cold start), and
    without enough of them its input is not comparable.

    When some of them paid a cold start and others did not (:func:`paid_min_ms`, each against the
    warm requests of its own input: one process of three loaded its model from a cold disk), the
    figures are those that paid it, compared with the warm requests of their inputs, and the
    others are counted in ``without_penalty``: the median of all hid a 12x first request behind
    "no cold-start penalty", and the median of two was their mean, a time no request took."""
    if not cold:
        return None
    cold_keys: list[InputKey | None] = []
    for r in cold:
        key = keys.key(r)
        cold_keys.append(None if key is None else (key, decoded_images(r)))
    # the warm requests of each cold input: its key's cohort, split by the images decoded
    by_key = group(warm, keys)
    cohorts: dict[InputKey, list[Request]] = {}
    for key in dict.fromkeys(k[0] for k in cold_keys if k is not None):
        for r in by_key.get(key, ()):
            cohorts.setdefault((key, decoded_images(r)), []).append(r)
    comparable_cold = [(r, k) for r, k in zip(cold, cold_keys)
                       if k is not None and len(cohorts.get(k, ())) >= COMPARABLE_MIN_REQUESTS]
    left_out = 0
    if comparable_cold and len(comparable_cold) < len(cold):
        # some inputs have their warm peers: compare those, leave the others out (not all with
        # all warm requests, where one rare input would make no cold request comparable)
        left_out = len(cold) - len(comparable_cold)
        cold = [r for r, _ in comparable_cold]
        cold_keys = [k for _, k in comparable_cold]
    same = all(k is not None and len(cohorts.get(k, ())) >= COMPARABLE_MIN_REQUESTS for k in cold_keys)
    if same:
        comparable = [r for k in dict.fromkeys(cold_keys) if k is not None for r in cohorts[k]]
    else:
        comparable = list(warm)
    without_penalty = 0
    if comparable:
        # each against the warm requests of its own input (all warm ones when not compared so)
        bar = {k: paid_min_ms([r.total_ms for r in (cohorts[k] if same and k is not None else comparable)])
               for k in dict.fromkeys(cold_keys)}
        paid = [i for i, (r, k) in enumerate(zip(cold, cold_keys)) if r.total_ms >= bar[k]]
        if paid and len(paid) < len(cold):
            without_penalty = len(cold) - len(paid)
            cold, cold_keys = [cold[i] for i in paid], [cold_keys[i] for i in paid]
            if same:
                comparable = [r for k in dict.fromkeys(cold_keys) if k is not None for r in cohorts[k]]
    distinct = set(cold_keys)
    first = cold_keys[0]
    comparable_median = statistics.median(r.total_ms for r in comparable) if comparable else None
    return ColdFigures(
        count=len(cold),
        total_ms=statistics.median(r.total_ms for r in cold),
        stages_ms=_per_stage(cold),
        comparable_median_total_ms=comparable_median,
        comparable_stages_ms=_per_stage(comparable),
        compared_with=SAME_INPUT if same else ALL_WARM,
        comparable_requests=len(comparable),
        warm_median_total_ms=statistics.median(r.total_ms for r in warm) if warm else None,
        cohort=first[0] if same and first is not None and len(distinct) == 1 else None,
        input_known=all(k is not None for k in cold_keys),
        first_of_process=first_of_process,
        left_out=left_out,
        without_penalty=without_penalty,
        stages_mean_ms=_per_stage(cold, statistics.fmean),
        failed=sum(1 for r in cold if r.error),
    )


#: A failed cold request counts in the cold figures (:func:`failed_cold_paid`) only where it stopped
#: (its first failed stage span, else the stage span that ended last) in one of these, the model's
#: stages (waiting for the executor that loads it, the model call) ...
FAILED_COLD_STAGES = (semconv.STAGE_QUEUE, semconv.STAGE_FORWARD)
#: ... and that stage holds at least this share of its total: a download that timed out, a
#: decompression bomb, an upload or an auth call that failed after a warm forward, a queue that
#: rejected it at once after a slow download, failed on something else than the cold start.
FAILED_COLD_STOP_MIN_SHARE = 0.5


def stopped_in(r: Request) -> tuple[str, bool] | None:
    """Where a failed request stopped: ``(stage, True)`` for its first failed stage span, else
    ``(stage, False)`` for the stage span that ended last; ``None`` without stage spans (the
    failures' ``stopped``: :func:`otel_stages.analysis.diagnosis.failure_kinds`)."""
    bad = [s for s in r.spans if s.error]
    if bad:
        return bad[0].name, True
    return (max(r.spans, key=lambda s: s.end_ns).name, False) if r.spans else None


def _stopped_in_the_model(r: Request) -> bool:
    stop = stopped_in(r)
    return stop is not None and stop[0] in FAILED_COLD_STAGES and (
        r.stages_ms.get(stop[0], 0.0) >= FAILED_COLD_STOP_MIN_SHARE * r.total_ms)


def failed_cold_paid(cold: Sequence[Request], warm: Sequence[Request], keys: CohortKeys
                     ) -> list[Request]:
    """The failed ones among ``cold`` (cold requests, any state) that ran until at least the cold
    bar of their input (:func:`paid_min_ms` over the warm requests of their input when at least
    :data:`COMPARABLE_MIN_REQUESTS` decoded the same images, else over all ``warm``) before they
    failed: they paid the cold start (a model load that outlasted the client's deadline), so they
    belong in the cold figures, their times a lower bound. Only one that stopped in the model's
    stages (:data:`FAILED_COLD_STAGES`), that stage holding :data:`FAILED_COLD_STOP_MIN_SHARE` of
    its total or more, and has a request span: one that failed sooner (a crash at start) or
    elsewhere (a network timeout, a bad image, an upload after a warm forward) says nothing about
    the cold start and stays out; the request after it may have paid it
    (:data:`REASON_AFTER_FAILED_START`)."""
    failed = [r for r in cold if r.error and r.span_id and _stopped_in_the_model(r)]
    if not failed or not warm:
        return []
    by_key = group(warm, keys)
    all_bar = paid_min_ms([r.total_ms for r in warm])
    paid = []
    for r in failed:
        key = keys.key(r)
        peers = [] if key is None else [w for w in by_key.get(key, ())
                                        if decoded_images(w) == decoded_images(r)]
        bar = (paid_min_ms([w.total_ms for w in peers]) if len(peers) >= COMPARABLE_MIN_REQUESTS
               else all_bar)
        if r.total_ms >= bar:
            paid.append(r)
    return paid


def paid_min_ms(warm_ms: Sequence[float]) -> float:
    """The least total (ms) of a cold request that paid a cold start against ``warm_ms`` (its
    comparable warm requests' totals): their p95 plus ``COLD_START_MIN_RATIO - 1`` times their
    median, about twice the median for steady warm runs, and above the slow ones where warm runs
    reach twice their median themselves (a bimodal forward: a first request in the slow mode is
    one of them, not a cold start). Infinite without warm requests."""
    if not warm_ms:
        return math.inf
    return percentile(warm_ms, 95) + (COLD_START_MIN_RATIO - 1) * statistics.median(warm_ms)


#: The warm-up bar's p95 (:func:`warm_up_min_ms`).
WARM_UP_BAR_QUANTILE = 0.95


def warm_up_min_ms(warm_ms: Sequence[float]) -> float:
    """The least total (ms) of a warm-up request against ``warm_ms`` (its input's warm requests
    after the warm-up): :func:`paid_min_ms`, but with the p95 the element at index
    ``floor(0.95 n)`` of the sorted totals (ClickHouse's ``quantileExactHigh``), not one
    interpolated between two: where the warm runs' own slow mode is 5-10 % of them (every
    fourteenth request slow), an interpolated p95 falls between the modes, and the first request
    of that mode after the cold one read as a warm-up (a tester's: seq 3, 317 ms, set apart
    while seq 15, 317 ms, stayed warm). Infinite without warm requests."""
    if not warm_ms:
        return math.inf
    ordered = sorted(warm_ms)
    high = ordered[min(len(ordered) - 1, int(WARM_UP_BAR_QUANTILE * len(ordered)))]
    return high + (COLD_START_MIN_RATIO - 1) * statistics.median(warm_ms)


@dataclass(frozen=True)
class SetApart:
    """A warm request reported apart: ``reason`` (:data:`REASON_NEW_INPUT` /
    :data:`REASON_AFTER_IDLE` / :data:`REASON_AFTER_FAILED_START` / :data:`REASON_WARM_UP`), its
    ``cohort``, ``ratio`` = ``total_ms`` / the cohort's
    ``comparable_median_total_ms``, and ``idle_s`` (seconds since the process's previous request
    ended; ``None`` for a new input)."""

    request: Request
    reason: str
    cohort: str | None
    comparable_median_total_ms: float
    ratio: float
    idle_s: float | None = None

    def figures(self) -> ApartFigures:
        """What the rules read (:class:`~otel_stages.analysis.figures.ApartFigures`)."""
        return ApartFigures(self.reason, self.request.seq, self.request.trace_id,
                            self.request.total_ms, self.comparable_median_total_ms, self.ratio,
                            self.idle_s)

    def to_dict(self) -> dict[str, object]:
        """JSON form for the report's ``set_apart`` list."""
        return {
            "trace_id": self.request.trace_id,
            "seq": self.request.seq,
            "reason": self.reason,
            "cohort": self.cohort,
            "total_ms": round(self.request.total_ms, 3),
            "comparable_median_total_ms": round(self.comparable_median_total_ms, 3),
            "ratio": round(self.ratio, 2),
            "idle_s": None if self.idle_s is None else round(self.idle_s, 1),
        }


def _one_decode(r: Request) -> bool:
    """At most one decode span: a request of several (several images, or one decoded twice) is
    not the first of its input, which is only its first image's."""
    return sum(1 for s in r.spans if s.name == semconv.STAGE_DECODE) <= 1


def find_set_apart(requests: Sequence[Request], keys: CohortKeys) -> list[SetApart]:
    """Warm requests to report apart (module docstring), in start order. ``requests`` are all
    requests (cold and failed included, any order); failed requests are never set apart."""
    return set_apart_and_warmup(requests, keys)[0]


def set_apart_and_warmup(requests: Sequence[Request], keys: CohortKeys
                         ) -> tuple[list[SetApart], WarmupFigures | None]:
    """:func:`find_set_apart`'s requests, and the warm-up among them (``None`` when no request
    was set apart as :data:`REASON_WARM_UP`; module docstring)."""
    by_process: dict[str, list[Request]] = defaultdict(list)
    for r, process in zip(requests, process_keys(requests)):
        by_process[process].append(r)
    flagged: dict[int, tuple[str, float | None]] = {}
    # per process: its warm-up candidates (warm requests after a cold one, fewer than
    # WARMUP_MAX_REQUESTS warm ones before them) and the position of the last one
    candidates: dict[str, list[Request]] = {}
    last_position: dict[str, int] = {}
    for process, reqs in by_process.items():
        reqs.sort(key=_start)
        started = any(r.cold for r in reqs)  # the process's start is in the recording
        seen: set[str | None] = set()
        last_end: int | None = None
        # the first request failed (a crash during model load, an OOM): the cold start may have
        # moved to the first request that succeeded after it
        failed_start = bool(reqs) and reqs[0].cold and reqs[0].error
        cold_seen = False
        cold_end = 0  # requests that started before the cold one ended waited for it
        warm_before = 0
        for r, k in zip(reqs, keys.keys(reqs)):
            if not r.cold and not r.error:
                behind = cold_seen and r.start_ns < cold_end
                warming = cold_seen and warm_before < WARMUP_MAX_REQUESTS and not behind
                if last_end is not None and r.start_ns - last_end >= IDLE_GAP_MIN_S * 1e9:
                    flagged[id(r)] = (REASON_AFTER_IDLE, (r.start_ns - last_end) / 1e9)
                elif failed_start:
                    flagged[id(r)] = (REASON_AFTER_FAILED_START, None)
                elif started and k is not None and k not in seen and _one_decode(r):
                    flagged[id(r)] = (REASON_NEW_INPUT, None)
                elif behind:
                    flagged[id(r)] = (REASON_BEHIND_COLD, None)
                elif warming:
                    flagged[id(r)] = (REASON_WARM_UP, None)
                if warming:
                    candidates.setdefault(process, []).append(r)
                    last_position[process] = warm_before
                failed_start = False
                warm_before += 1
            cold_seen = cold_seen or r.cold
            if r.cold:
                cold_end = max(cold_end, r.end_ns)
            seen.add(k)
            last_end = r.end_ns if last_end is None else max(last_end, r.end_ns)
    if not flagged:
        return [], None
    warm = [r for r in requests if not r.cold and not r.error]
    # the other reasons compare with the warm requests not flagged for one of them (as before
    # the warm-up was looked at); the warm-up with those after it (no candidate), so its own tail
    # does not raise the bar
    others = {i for i, (reason, _) in flagged.items() if reason != REASON_WARM_UP}
    by_key: dict[str | None, list[Request]] = defaultdict(list)
    for r, k in zip(warm, keys.keys(warm)):
        by_key[k].append(r)
    # a cohort split by the images decoded (as cold_figures compares), for the flagged ones' keys
    by_images: dict[str, dict[tuple[Image, ...] | None, list[Request]]] = {}

    def pool_of(key: InputKey | None) -> list[Request]:
        if key is None:
            return warm  # an unknown input: all of them
        k, images = key
        if k not in by_images:
            split = by_images[k] = {}
            for c in by_key.get(k, ()):
                split.setdefault(decoded_images(c), []).append(c)
        return by_images[k].get(images, [])

    # (median, bar) per input and kind of reason, for the inputs asked (many warm-up requests
    # share a few)
    bars: dict[tuple[bool, InputKey | None], tuple[float, float] | None] = {}

    def bar_of(warm_up: bool, key: InputKey | None) -> tuple[float, float] | None:
        if (warm_up, key) in bars:
            return bars[warm_up, key]
        left_out: Container[int] = flagged if warm_up else others
        comparable = [r for r in pool_of(key) if id(r) not in left_out]
        out = None
        if len(comparable) >= COMPARABLE_MIN_REQUESTS:  # else nothing to tell it apart from
            totals = [c.total_ms for c in comparable]
            median = statistics.median(totals)
            # the warm-up looks at every started process's first requests: one in the slow mode
            # of a bimodal steady forward reaches 2x the median, so it must pass the cold
            # request's bar
            if median > 0:
                out = median, warm_up_min_ms(totals) if warm_up else COLD_START_MIN_RATIO * median
        bars[warm_up, key] = out
        return out

    standing: dict[int, SetApart] = {}
    for r in (r for r in requests if id(r) in flagged):
        k = keys.key(r)
        reason, idle = flagged[id(r)]
        found = bar_of(reason in (REASON_WARM_UP, REASON_BEHIND_COLD),
                       None if k is None else (k, decoded_images(r)))
        if found is not None and r.total_ms >= found[1]:
            standing[id(r)] = SetApart(r, reason, k, found[0], r.total_ms / found[0], idle)
    runs: list[_WarmupRun] = []
    for process, cands in candidates.items():
        # the warm-up: the candidates set apart, consecutively from the cold request
        prefix = list(itertools.takewhile(lambda r: id(r) in standing, cands))
        warm_up = [standing[id(r)] for r in prefix if flagged[id(r)][0] == REASON_WARM_UP]
        for r in cands[len(prefix):]:
            if flagged[id(r)][0] == REASON_WARM_UP:
                standing.pop(id(r), None)  # after the warm-up ended: not part of it
        if warm_up:
            ended = len(prefix) < len(cands)
            capped = not ended and last_position[process] == WARMUP_MAX_REQUESTS - 1
            runs.append(_WarmupRun(len(prefix) + 1, ended, capped, max(a.ratio for a in warm_up),
                                   len(warm_up)))
    out = sorted(standing.values(), key=lambda a: _start(a.request))
    return out, _warmup_figures(runs)


@dataclass(frozen=True)
class _WarmupRun:
    """One process's warm-up: ``requests`` it lasted (its cold request included), whether a later
    request ``ended`` it, whether it reached the cap (``capped``), its ``max_ratio`` and
    ``apart`` (its requests set apart as warm-up)."""

    requests: int
    ended: bool
    capped: bool
    max_ratio: float
    apart: int


def _warmup_figures(runs: Sequence[_WarmupRun]) -> WarmupFigures | None:
    if not runs:
        return None
    longest = max(r.requests for r in runs)
    return WarmupFigures(
        processes=len(runs), requests=sum(r.apart for r in runs), longest_requests=longest,
        longest_ended=all(r.ended for r in runs if r.requests == longest),
        unended=sum(1 for r in runs if not r.ended), capped=sum(1 for r in runs if r.capped),
        max_ratio=max(r.max_ratio for r in runs))
