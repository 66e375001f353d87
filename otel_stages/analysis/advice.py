"""Advice text per cause: concrete next steps an engineer can try. Pure data, no logic beyond
picking lines (and filling in the numbers of the facts that picked them)."""

from __future__ import annotations

from collections.abc import Sequence

from otel_stages.analysis.figures import DraftEstimate, PreprocessFacts
from otel_stages.analysis.gpu import MAX_SAMPLE_COUNT
from otel_stages.analysis.preprocessing import SEVERAL_IMAGES_MIN_SHARE
from otel_stages.analysis.units import duration, pct

MORE_RUNS = (
    "send the same input 20+ times to one process (otel-stages demo does this) and report again"
)
#: advice per reason a warm request was set apart as cold (``figures.REASON_*``)
WARM_UP_AGAIN: dict[str, str] = {
    "after_idle": ("a request after an idle gap was cold again: keep the process warm while idle"
                   " (a periodic warm-up request, no scale-to-zero of GPU clocks or caches)"),
    "new_input": ("the first request of a new input shape was cold: warm up each input shape the"
                  " service accepts at startup (kernel autotuning, compiled graphs per shape)"),
    "after_failed_start": ("the first request failed and the next paid the cold start: find why"
                           " the first failed (its error above) and warm the model up before"
                           " serving"),
    "behind_cold_start": ("requests that arrived during the cold start waited for it or ran on a"
                          " process still warming: keep the replica out of the load balancer"
                          " until its warm-up is done (a readiness probe that passes only after"
                          " it)"),
    # (the rules word it with the warm-up's length: :func:`warm_up_with`)
    "warm_up": ("the requests right after the cold one were slow too: warm the model up with"
                " several requests at startup (each input shape and code path), not one"),
}
UNTRACED = (
    "wrap the untraced work (auth, tokenization, response encoding, locks) in stage() spans so"
    " the swing lands on a named stage"
)
#: A call's own time (outside the requests it calls) swings: where a client waits, not the callee.
CALL_OWN = (
    "{stage}'s own time, outside the requests it calls, is the caller's: check its HTTP client's"
    " connection pool (a pool limit below the concurrency it serves queues calls: httpx's"
    " Limits(max_connections=...), aiohttp's TCPConnector(limit=...)), keep-alive (new"
    " connections pay DNS, TCP and TLS each time), the network between the two, and whether the"
    " called server accepts requests late (its accept backlog, too few workers), reading the"
    " response after the called request ended (a large or streamed body, a slow client read), or,"
    " for calls that reach no request read here, the service they call; time the client's wait"
    " apart (a stage() around acquiring the connection) to tell them apart"
)
#: A call's own time that swings before the requests it calls start (calls.own_side).
CALL_OWN_BEFORE = (
    "{stage}'s own time swings before the requests it calls start, so the wait is the caller's"
    " client or the way in: a pooled connection's wait (a pool limit below the concurrency it"
    " serves: httpx's Limits(max_connections=...), aiohttp's TCPConnector(limit=...)), new"
    " connections (DNS, TCP and TLS each time without keep-alive), or the called server accepting"
    " late (its accept backlog, too few workers); time the client's wait apart (a stage() around"
    " acquiring the connection) to tell them apart"
)
#: ... or after they end.
CALL_OWN_AFTER = (
    "{stage}'s own time swings after the requests it calls end: reading the response (a large or"
    " streamed body, a slow client read) or the network back; check the response size and how the"
    " client reads it, and whether the called server's request span ends before its body is sent"
)
#: A call that makes more calls in some requests than in others (retries, one per item).
CALL_REPEATED = (
    "{stage} calls {service} more than once in some requests: if these are retries, find why the"
    " first call failed or timed out (the client's retry policy and timeout, the callee's errors);"
    " if one call per item, send the items in one call or make the calls at once"
)
#: A cold request that failed after paying the cold start (figures.ColdFigures.failed).
COLD_FAILED = (
    "a cold request failed during its cold start (its error says how: a client, proxy or server"
    " deadline shorter than the model load, or the load itself failing, e.g. out of memory): load"
    " and warm the model before the process takes traffic (before its readiness probe passes, or"
    " before a reloaded model is switched in) so no request meets the cold start"
)
WARM_UP = (
    "warm the model up at startup: run one dummy request before the readiness probe passes, so"
    " no user pays for weight loading, allocation and kernel compilation"
)



def warm_up_with(requests: int, ended: bool) -> str:
    """The warm-up advice (as :data:`WARM_UP`, which says one request) for a warm-up that lasted
    ``requests`` requests, the cold one included; ``ended``: a later request stood within the warm
    runs (else it may be longer: more are advised, and a longer recording to see its end)."""
    if ended:
        return (f"warm the model up at startup with {requests} dummy requests, not one: the"
                f" warm-up lasted {requests} requests; run {requests} of each input shape and code"
                " path the service serves before the readiness probe passes, so no user pays for"
                " lazy compilation, autotuning and caches filling")
    return (f"warm the model up at startup with more than {requests} dummy requests, not one: the"
            f" warm-up had not ended after {requests} requests; run more of each input shape and"
            " code path the service serves before the readiness probe passes, and record a longer"
            " run after a restart to see where the warm-up ends")


def warm_up_in_call(stage: str, services: str | Sequence[str], requests: int, ended: bool) -> str:
    """:func:`warm_up_with` for a warm-up paid inside ``stage``, a call into the requests of
    ``services`` (one name, or several: each request paid one of them), which ``--service`` left
    out: their warm-up (or, for several, their processes' cold starts too)."""
    names = [services] if isinstance(services, str) else list(services)
    many = f"{requests}" if ended else f"more than {requests}"
    if len(names) == 1:
        (service,) = names
        return (f"the requests after the first pay {service}'s warm-up inside {stage}: warm"
                f" {service}'s model up at startup with {many} dummy requests, not one, before its"
                f" readiness probe passes; otel-stages report ... --service {service} shows it")
    whose = " or ".join(f"{n}'s" for n in names)
    upto = f"up to {requests}" if ended else f"more than {requests}"
    return (f"the requests after the first pay {whose} cold start or warm-up inside {stage}: load"
            f" and warm each of {', '.join(names)} up at startup ({upto} dummy requests, not one)"
            " before its readiness probe passes; otel-stages report ... --service NAME shows each"
            " one's")


#: the last queue advice line, whatever the batches and the GPU say
QUEUE_DEPTH = "watch queue.depth: a deep queue means arrival rate exceeds throughput, so add replicas"
#: Leads the advice when the input mix explains the swing and every input is steady
#: (:func:`otel_stages.analysis.decision.decide`, ``STEADY_INPUTS_MIN_SHARE``).
STEADY_INPUTS = (
    "latency follows the input and each input is steady: compare like with like (latency per image"
    " size, prompt or output length); to narrow the spread, cap the costliest inputs (smaller images,"
    " shorter max output length) or serve them on replicas of their own"
)
#: ``other``: find which sub-step of a custom stage swings.
CUSTOM_SUBSTEPS = (
    "a custom stage swings: time its sub-steps with nested stage() spans to find which one;"
    " this report counts nested spans named as standard stages (download, decode, resize,"
    " queue, forward) in place of the custom stage, while sub-steps with other names show"
    " in the trace waterfall (Jaeger, Tempo), not in its table"
)


def left_out_call(stage: str, service: str) -> str:
    """The advice on a stage whose swing is that of the requests it calls, which ``--service``
    left out (:func:`otel_stages.analysis.decision.decide`): the called service's report, or the
    report of both, which reads the called service's stages in place of the call."""
    return (f"report {service} alone (otel-stages report ... --service {service}) to see which of"
            f" its stages makes {stage} swing, or both services without --service, which reads"
            f" {service}'s stages in place of {stage}")


def calls_differ(stage: str, slower: str, services: Sequence[str]) -> str:
    """The advice on a stage whose swing is which of several services it calls (each steady
    there), which ``--service`` left out: compare like with like, and the slower service."""
    each = " and ".join(f"--service {s}" for s in services)
    return (f"{stage}'s time follows which service it calls, each steady: compare like with like"
            f" (otel-stages report ... {each}); to narrow the spread, speed up {slower} (its"
            f" requests take the longest) or route fewer of these calls to it")


def cold_in_call(stage: str, services: Sequence[str]) -> str:
    """The advice on a cold request whose extra time lies in a call into the requests of other
    ``services`` (one or more), which ``--service`` left out
    (:func:`otel_stages.analysis.decision.decide`): the cold start is theirs."""
    whose = " or ".join(f"{s}'s" for s in services)
    return (f"the first requests pay {whose} cold start inside {stage}: load and warm"
            f" {whose} model before it takes traffic (before its readiness probe passes) and keep"
            f" at least one replica warm; otel-stages report ... --service {services[0]} shows where"
            " it lies")


#: ``other``: a custom stage that does a standard stage's work gets that stage's evidence once
#: named or mapped so (a tester's ``inference`` span: GPU readings during it went unread).
CUSTOM_IS_STANDARD = (
    "if the custom stage does a standard stage's work (the model call: forward; decoding images:"
    " decode; fetching inputs: download), name its spans so or map them with --stage-map (a file"
    " listing the request's stages, e.g. {stage: forward, span: inference}), and the report reads"
    " that stage's own evidence: the GPU's during forward, image sizes for decode"
)
#: The ``forward`` advice that asks whether inputs vary (dropped once the input mix says they do).
INPUTS_VARY = "check whether input shapes (image tiles, prompt or output length) vary between calls"
#: :data:`INPUTS_VARY` where every warm request had one input (the image's shape cannot vary).
ONE_INPUT_VARY = (
    "every warm request had the same input ({key}), so the image's shape does not vary: check"
    " whether the prompt or output length does, or whether the stage slows over the process's"
    " life (a leak, a growing cache: compare early and late requests)"
)
#: The ``gpu_busy`` line on other work and shapes (:data:`OTHER_GPU_WORK` where one input).
OTHER_WORK_OR_SHAPES = ("check for other processes on the same GPU (nvidia-smi) and for input"
                        " shapes that vary")
OTHER_GPU_WORK = "check for other processes on the same GPU (nvidia-smi)"
#: Requests wait for batches to fill when the median fill (first enqueue, or the previous batch's
#: end, to pickup: :mod:`otel_stages.analysis.batching`) is at least this part of their median
#: wait; under it they mostly wait for the executor to finish the batch before theirs, which a
#: shorter fill timeout or a smaller batch does not shorten. The same share at the p95s tells
#: what the slow requests (the swing) wait for, and decides first (:func:`for_queue`).
BATCH_FILL_MIN_SHARE = 0.25


def for_queue(gpu_level: str, gpu_words: str, fill_ms: float | None, wait_ms: float | None,
              fill_p95_ms: float | None = None, wait_p95_ms: float | None = None) -> list[str]:
    """Advice lines for ``queue``, by what the requests wait for and whether the GPU has headroom:
    ``fill_ms`` / ``wait_ms``, the batches' median fill and the requests' median wait, and
    ``fill_p95_ms`` / ``wait_p95_ms`` their p95s (``None``: no ``batch`` spans read, as from
    ClickHouse); ``gpu_level`` a ``GpuEvidence.level``, ``gpu_words`` its judged mean
    (``GpuEvidence.judged_words``). The p95s overrule the medians: the swing is the slow
    requests' wait, and when they wait for the executor (busy with a batch before theirs, or held
    between batches) a shorter fill timeout would cut only the typical wait; when they wait for a
    batch to fill while the typical request waits for the executor, the fill timeout is the
    swing. A busy GPU (``high``) has no headroom: more concurrency adds no throughput, so it is
    not advised, nor a smaller max batch (it lowers throughput)."""
    busy = gpu_level == "high"
    smaller = "" if busy else " or the max batch size"
    med = (fill_ms, wait_ms) if fill_ms is not None and wait_ms else None
    p95 = (fill_p95_ms, wait_p95_ms) if fill_p95_ms is not None and wait_p95_ms else None
    med_exec = med is not None and med[0] < BATCH_FILL_MIN_SHARE * med[1]
    tail_exec = p95 is not None and p95[0] < BATCH_FILL_MIN_SHARE * p95[1]
    if med is not None and med_exec and (tail_exec or p95 is None):
        first = (f"requests wait for the executor, not for batches to fill (batches filled in"
                 f" {duration(med[0])} median of the {duration(med[1])} median wait): the"
                 " executor is still running the batch before theirs")
    elif p95 is not None and tail_exec:
        first = (f"the slow requests wait for the executor, not for batches to fill (they waited"
                 f" {duration(p95[1])} at the p95, batches filled in {duration(p95[0])}"
                 " at the p95): the executor was still busy with a batch before theirs, or held"
                 " between batches (a stalled model call, a lock it takes): look at what the"
                 " executor did while they waited (the batch spans' model-call times, a profile"
                 " of its thread), not at the fill timeout, which would cut only the typical wait")
    elif p95 is not None and med_exec:  # the typical request waits for the executor, the slow ones for a fill
        first = (f"the slow requests wait for batches to fill (they waited {duration(p95[1])}"
                 f" at the p95, batches filled in {duration(p95[0])} at the p95; the typical"
                 " request waits for the executor instead): lower the batch fill timeout (max"
                 f" wait){smaller}")
    elif med is not None:
        first = (f"requests wait for batches to fill ({duration(med[0])} median of the"
                 f" {duration(med[1])} median wait): lower the batch fill timeout (max wait){smaller}")
    else:
        first = ("requests wait for the batch/executor: if batches wait to fill, lower the batch"
                 f" fill timeout (max wait){smaller}")
    if busy:
        capacity = (f"the GPU is busy during forward ({gpu_words}): more executor concurrency adds"
                    " no throughput; add replicas or GPUs, or cut the work per call (lower"
                    " precision, fewer image tiles or tokens)")
    elif gpu_level in ("low", "medium"):
        capacity = (f"the GPU has headroom during forward ({gpu_words}): raise executor concurrency"
                    " / worker count")
    else:
        capacity = ("raise executor concurrency / worker count if the GPU has headroom (the GPU"
                    " evidence here cannot tell)")
    return [first, capacity, QUEUE_DEPTH]


_ADVICE: dict[str, list[str]] = {
    "transfer": [
        "the time is in fetching the image, not in preprocessing: look at network / remote storage",
        "reuse HTTP connections (one pooled httpx.Client/Session) and set connect/read timeouts",
        "fetch from storage in the same region/zone, or cache hot images locally",
        "send image bytes in the request (or presigned URLs to a nearby CDN) instead of slow origins;"
        " retry slow fetches with a hedged second request",
    ],
    "queue": [
        "requests wait for the batch/executor: lower the batch fill timeout (max wait) or the max"
        " batch size",
        "raise executor concurrency / worker count if the GPU has headroom",
        QUEUE_DEPTH,
    ],
    "gpu_busy": [
        "the GPU is saturated during slow forwards: reduce work per call (smaller batch, fewer"
        " image tiles/tokens, shorter max output length)",
        "use lower precision (bf16/fp16) and fused kernels (torch.compile, TensorRT)",
        OTHER_WORK_OR_SHAPES,
        "add GPU capacity or spread load across replicas",
    ],
    "gpu_starved": [
        "the GPU idles during slow forwards: they wait on the host (data copies, locks,"
        " allocation)",
        "copy inputs with pinned memory and non_blocking=True; prepare tensors before the forward",
        "avoid host syncs inside forward (.item(), .cpu(), printing tensors) and Python-side locks",
        "pre-allocate / reuse CUDA memory (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) and"
        " keep tokenization/preprocessing out of the timed forward",
    ],
    "forward": [
        INPUTS_VARY,
    ],
    "cold_start": [
        WARM_UP,
        "cache compiled kernels / engines (torch.compile cache dir, TensorRT engine) across restarts",
        "load weights before serving and keep at least one replica warm (min replicas > 0)",
    ],
    "other": [CUSTOM_SUBSTEPS, CUSTOM_IS_STANDARD],
}


#: cause ``forward``: why the GPU evidence could not decide, by GPU evidence level
#: (:data:`otel_stages.analysis.gpu.LEVEL_NONE` / ``LEVEL_THIN`` / ``LEVEL_MEDIUM``).
_FORWARD_BY_GPU_LEVEL = {
    "none": "the model call swings but there is no GPU data: enable the GPU sampler"
            " (hw.gpu.utilization metrics, their unit declared) to tell a busy GPU from a"
            " starved one",
    "thin": "too few GPU samples fall inside forward spans (or inside the slow ones, which decide)"
            " to call it: collect more runs or lower"
            " OTEL_STAGES_GPU_INTERVAL_S (the driver samples about every 1/6 s)",
    "medium": "GPU utilization during forward is in between (neither clearly busy nor starved):"
              " profile one slow forward (torch.profiler, Nsight Systems) to see whether kernels"
              " or host-side gaps dominate",
}


#: cause ``forward`` with no GPU data while forward spans carry ``gpu.utilization.mean`` values that
#: are no reading (``GpuEvidence.unread_forwards``): the sampler runs, its values are unusable.
GPU_UNREAD = (
    "the model call swings but its GPU readings cannot be used: write gpu.utilization.mean on each"
    " forward span as a number from 0 to 1 (or percent), with gpu.sample_count an int from 1 to"
    f" {MAX_SAMPLE_COUNT:,} (see the problems), to tell a busy GPU from a starved one")


#: cause ``forward`` with thin GPU evidence because the readings do not line up with the forward
#: spans (``GpuEvidence.misaligned_processes``: less busy during the forwards than between them).
GPU_MISALIGNED = (
    "check the GPU sampler's clock and timestamps against the spans' (sync the hosts' clocks with"
    " NTP / chrony; an exporter should stamp each reading's time, not its scrape time) and that"
    " its hw.id is the model's GPU, then report again: until the readings line up with the"
    " forwards they cannot tell a busy GPU from a starved one")


#: cause ``forward`` with thin GPU evidence while some process's model GPU could not be told among
#: the GPUs read during its forwards (``GpuEvidence.unidentified_processes``).
GPU_UNIDENTIFIED = (
    "tell which GPU runs the model: with otel-stages' sampler call"
    " otel_stages.gpu.set_model_device(...) (or run one GPU per process) so each forward span"
    " carries gpu.utilization.mean, or send only the model's GPU (drop the node's other hw.id"
    " series in the Collector)")


#: preprocess, the stage's cost follows input size: the large inputs are its slow runs.
CAP_SIZE = (
    "preprocessing cost follows image size: the large inputs take longest to decode and resize"
    " (whatever else slows whole requests), so cap them (ask clients to"
    " downscale, or reject/resize images above the model's input resolution before decoding in"
    " full)"
)
#: preprocess, one pixel size and the cost follows the encoded bytes (``StageEvidence.bytes_only``).
BYTES_NOT_PIXELS = (
    "preprocessing cost follows the encoded bytes, not the pixels (every image had one pixel size):"
    " the images' format or compression differs (a PNG decodes several times slower than a JPEG of"
    " the same pixels), so ask clients for JPEG or WebP, or convert large PNGs once when they are"
    " uploaded rather than on every request"
)
#: preprocess, sizes vary but cost does not follow them.
NOT_SIZE = (
    "cost does not follow image size: look for repeated decodes, lock or GIL contention, CPU"
    " contention or throttling"
)
#: preprocess, every request had the same input size.
ONE_SIZE = (
    "every request had the same image size, so the swing is not the input: look for repeated"
    " decodes, lock or GIL contention, CPU contention or throttling"
)
#: preprocess, requests decoded several images and cost does not follow their first image's size
#: (:func:`several_images_lead`): that size is not the request's input.
SEVERAL_IMAGES = (
    "requests decoded several images, and the size figures read only each request's first image:"
    " compare the slow requests' decode spans (how many images, how large) with the fast ones'"
    " before looking for contention"
)


def several_images_lead(facts: PreprocessFacts, follows_size: bool | None) -> bool:
    """Whether the size advice is :data:`SEVERAL_IMAGES`: some warm requests decoded several
    images, cost does not follow the first images' size, and either the first images are one size
    (``follows_size`` is ``None``: only the other images vary) or at least
    ``preprocessing.SEVERAL_IMAGES_MIN_SHARE`` of the warm decodes had several images."""
    if not facts.several_images or follows_size is True:
        return False
    return follows_size is None or facts.several_images >= SEVERAL_IMAGES_MIN_SHARE * facts.decodes
#: preprocess, input sizes unknown.
SIZE_UNKNOWN = (
    "record image.width / image.height on the decode span (otel_stages.imaging.decode does) to"
    " tell whether cost follows input size"
)
#: no verdict: the total swings, but spread over several stages.
SPREAD = (
    "several stages swing together and none stands out: look for what slows the whole process"
    " (CPU contention or throttling, garbage-collector pauses, a blocked event loop) and time"
    " the suspect work in its own stage() spans"
)


#: a stage verdict where the stages slow together (``caveats.together_caveat``): the whole
#: process slows, and the stage named is only where it shows most.
TOGETHER = (
    "the stages slow together: before tuning one stage, find what slows the whole process while"
    " requests are slow: threads holding the GIL or the CPU beside the request threads, other"
    " processes on the host, garbage-collector pauses, swapping (record the stages' thread CPU"
    " time, thread.cpu_time_ms, and the run-queue wait to see which: README, Signals)"
)


#: gpu_busy / gpu_starved judged on all forwards (the slow ones could not be judged apart:
#: ``GpuEvidence.judged_on``): the first line says "during forward", not "during slow forwards".
_GPU_ALL_FORWARDS = {
    "gpu_busy": "the GPU is saturated during forward: reduce work per call (smaller batch, fewer"
                " image tiles/tokens, shorter max output length)",
    "gpu_starved": "the GPU idles during forward: it waits on the host (data copies, locks,"
                   " allocation)",
}


def with_one_input(lines: Sequence[str], key: str | None) -> list[str]:
    """``lines`` where every warm request had the input ``key`` (``None``: inputs vary or are
    unknown): no advice to check whether the image's shape varies."""
    if key is None:
        return list(lines)
    swap = {INPUTS_VARY: ONE_INPUT_VARY.format(key=key), OTHER_WORK_OR_SHAPES: OTHER_GPU_WORK}
    return [swap.get(line, line) for line in lines]


def for_cause(cause: str, *, follows_size: bool | None = None, one_size: bool = False,
              gpu_level: str | None = None, preprocess: PreprocessFacts | None = None,
              gpu_slow: bool = True, gpu_unidentified: bool = False,
              gpu_unread: bool = False, bytes_only: bool = False,
              gpu_misaligned: bool = False) -> list[str]:
    """Advice lines for ``cause``. For ``preprocess`` the first line follows the size evidence:
    cost follows size (``follows_size=True``: cap the inputs), every input had one size
    (``one_size``), requests decoded several images and cost does not follow their first one's
    size (:func:`several_images_lead`), decode spans without the sizes to tell a repeat from several
    images (``preprocess.decodes_untold``: :data:`RECORD_DECODE_SIZES`), sizes vary but cost does
    not follow (``False``), or sizes unknown (``None``);
    the concrete fixes after it follow the decode / resize facts (:func:`preprocess_fixes`).
    For ``forward`` the first line says why the GPU evidence (``gpu_level``, a
    ``GpuEvidence.level``) could not decide. ``gpu_slow``: ``gpu_busy`` / ``gpu_starved`` was
    judged on the slow forwards (else on all: the first line says so). ``gpu_unidentified``:
    the GPU evidence is thin because no model GPU could be told (:data:`GPU_UNIDENTIFIED`).
    ``gpu_unread``: there is no GPU data but forward spans carry unusable values
    (:data:`GPU_UNREAD`). ``bytes_only``: one pixel size, the cost following the encoded bytes
    (:data:`BYTES_NOT_PIXELS` in place of capping the sizes). ``gpu_misaligned``: the GPU evidence
    is thin because the readings do not line up with the forwards (:data:`GPU_MISALIGNED`)."""
    lines = list(_ADVICE.get(cause, []))
    if cause == "preprocess":
        lines = preprocess_fixes(preprocess)
    if cause == "forward":
        lines.insert(0, GPU_MISALIGNED if gpu_misaligned else
                     GPU_UNIDENTIFIED if gpu_unidentified else GPU_UNREAD if gpu_unread else
                     _FORWARD_BY_GPU_LEVEL.get(gpu_level or "none", _FORWARD_BY_GPU_LEVEL["none"]))
    if cause in _GPU_ALL_FORWARDS and not gpu_slow:
        lines[0] = _GPU_ALL_FORWARDS[cause]
    if cause == "preprocess":
        if one_size:
            first = ONE_SIZE
        elif preprocess is not None and several_images_lead(preprocess, follows_size):
            first = SEVERAL_IMAGES
        elif preprocess is not None and preprocess.decodes_untold and follows_size is None:
            first = RECORD_DECODE_SIZES  # the sizes on every decode span, not width / height
        elif follows_size is True:
            first = BYTES_NOT_PIXELS if bytes_only else CAP_SIZE
        elif follows_size is False:
            first = NOT_SIZE
        else:
            first = SIZE_UNKNOWN
        if first in lines:
            lines.remove(first)
        lines.insert(0, first)
    return lines


#: cause ``cold_start``: the first line by the stage that took the extra time (the model's
#: warm-up lines follow only for ``forward``, or when no stage is named).
_COLD_BY_STAGE = {
    "download": ("the first request paid for opening the connection to the image origin (DNS,"
                 " TCP, TLS) and filling the connection pool: create the HTTP client at startup,"
                 " reuse it, and fetch one image from each origin before serving"),
    "decode": ("the first decode paid one-time setup (codec plugin imports, decoder tables,"
               " thread pools): decode one image of each accepted format at startup"),
    "resize": ("the first resize paid one-time setup (filter tables, thread pools, SIMD"
               " dispatch): resize one image to the model's input size at startup"),
    "queue": ("the first request waited in the queue: for the batcher / executor workers to"
              " start, or behind a batch whose forward loaded the model lazily: start them and"
              " load and warm the model at startup, before the readiness probe passes"),
    # figures.COLD_UNTRACED: the extra time lies outside every stage span
    "(unaccounted)": ("the first request's extra time lies outside every stage span: one-time"
                      " setup done lazily inside the request (building an HTTP client or session,"
                      " imports, loading a tokenizer or model on first use): do it at startup, or"
                      " wrap it in stage() spans to see which"),
}


def for_cold_start(stage: str | None) -> list[str]:
    """Advice lines for ``cold_start`` whose extra time lay in ``stage`` (``None``: unknown;
    ``"(unaccounted)"``, :data:`otel_stages.analysis.figures.COLD_UNTRACED`: outside every stage
    span)."""
    first = _COLD_BY_STAGE.get(stage or "")
    if first is None:
        return list(_ADVICE["cold_start"])
    return [first, "keep at least one replica warm (min replicas > 0) so restarts are rare"]


def more_runs(missing: int) -> str:
    """Advice when the verdict is tentative: ``missing`` more warm requests give a firm one."""
    return (f"{MORE_RUNS_PREFIX}{missing} more time{'s' if missing != 1 else ''} (20+ warm requests"
            " in all) and report again before acting on this verdict")


#: every "send more requests" advice starts so (see :func:`more_runs`)
MORE_RUNS_PREFIX = "send the same input "
FIX_FAILURES = (
    "fix the failing requests first (see the error types above and the failed spans' exception"
    " events); sending more requests will not make the timings trustworthy while many fail, and"
    " the latency of the rest may change once they succeed"
)


def slow_failures(stage: str | None) -> str:
    """Advice when failed requests are the slow tail (:func:`~otel_stages.analysis.caveats
    .failures_slow`); ``stage``: where they spent most of their time (``None``: no stage did)."""
    # whether a deadline, a rejection or a crash ended them is the error types' to say (a third
    # tester: 50 MP images rejected after decoding were told "decode stalls until a deadline")
    if stage is None:
        return ("find where the failed requests spend their time before they fail (no stage span"
                " holds most of it: wrap the rest in stage() spans); their error types above say"
                " how they ended (a deadline, a rejection)")
    return (f"find why the failed requests spend most of their time in {stage} before they fail"
            f" (a stall run on to a deadline, or work on an input that is then rejected): their"
            f" error types above and {stage}'s spans and exception events say how it ended")


SAMPLED = (
    "for figures that describe every request, record this investigation with every request kept"
    " (OTEL_STAGES_SAMPLE_RATIO=1, or the collector's tail sampling off for this service), or,"
    " where the request spans carry otel_stages.sampling.kept, read only those kept by the ratio"
    " (kept=ratio): a sampler that keeps slow requests whole makes the slow ones look typical"
)

UNTRACED_SHARE = (
    "more request time is outside the stage spans than in any one of them: wrap that work"
    " (auth, tokenization, waiting on another host, response encoding) in stage() spans before"
    " optimising a stage; if a stage"
    " ran on another host, check that its clock agrees with this one's"
)


SYNC_CLOCKS = (
    "sync the clocks of the hosts that record stage spans (NTP / chrony) or record each stage on"
    " its request's host, then report again: until then the skewed stages count 0 ms and their"
    " time shows as untraced"
)


def for_stable_untraced(first: str = UNTRACED_SHARE) -> list[str]:
    """Advice when nothing swings and untraced time is the largest share; ``first``: what to do
    about it (:data:`UNTRACED_SHARE`, or :data:`SYNC_CLOCKS` when it is clock skew)."""
    return [
        STEADY,
        ("before reading the stage shares: " if first == SYNC_CLOCKS
         else "to lower latency overall, start with the untraced time: ") + first,
    ]


#: The first advice of a steady run.
STEADY = "latency is steady: no per-stage fix is needed for variability"


def steady_but_failed(failed: int) -> str:
    """:data:`STEADY` when some requests failed: the steadiness is of the others only."""
    return (f"latency of the requests that succeeded is steady (no per-stage fix is needed for"
            f" their variability); {'the one' if failed == 1 else f'the {failed}'} that failed"
            f" {'is' if failed == 1 else 'are'} not in these timings: look at"
            f" {'its' if failed == 1 else 'their'} error spans and exception events first")


def for_stable_loop(holder: str | None) -> list[str]:
    """Advice when nothing swings and the largest stage mostly waited for a busy event loop
    (``holder``: the stage that held it most, when known)."""
    what = f"move {holder} off the event loop" if holder else "find what holds the event loop and move it off"
    return [
        STEADY,
        f"to lower latency overall, {what} (await asyncio.to_thread(...) or"
        " loop.run_in_executor(...)): every request waits for it",
    ]


def for_stable(largest_stage: str) -> list[str]:
    """Advice when nothing swings: latency is predictable; cut the biggest stage if needed."""
    return [
        STEADY,
        f"to lower latency overall, start with {largest_stage}, the largest share of the total",
    ]


# --- preprocess: concrete fixes from the decode / resize facts ---------------------------------

#: preprocess, decode / resize ran on a thread with a running asyncio event loop.
OFF_LOOP = (
    "move decode/resize off the asyncio event loop: await loop.run_in_executor(pool, ...) with one"
    " ThreadPoolExecutor sized to the CPU cores; while it runs on the loop's thread no other request"
    " makes progress"
)
#: preprocess, the facts do not say where decode / resize ran.
RECORD_THREADS = (
    "record thread.name and otel_stages.event_loop.running on the decode/resize spans"
    " (otel_stages.imaging does) to tell whether a pool or moving the work off an event loop is the"
    " fix"
)


def record_draft_facts(missing: Sequence[str]) -> str:
    """preprocess, decodes whose format or resize target is unknown: draft decoding cannot be
    judged. ``missing``: :attr:`PreprocessFacts.draft_missing
    <otel_stages.analysis.figures.PreprocessFacts.draft_missing>`, not empty."""
    return (f"record {' and '.join(missing)} (otel_stages.imaging does) to estimate what JPEG"
            " draft decoding would save")


#: standard stage spans end after their request span (caveats.outlived_caveat).
END_REQUEST_SPAN = (
    "end the request span when the response is complete (for a streamed response, after its last"
    " chunk is sent), or time the work after the answer in a span of its own outside the request;"
    " if the stage ran on another host, sync the hosts' clocks instead; then report again"
)
#: standard stage spans start before their request span (caveats.before_caveat).
SYNC_CLOCKS_BEHIND = (
    "sync the clocks of the hosts that record the request and its stages (NTP / chrony), or start"
    " the request span before the work it times; then report again: until then the stages that"
    " start before it are clipped to it"
)
#: preprocess, some requests decoded their image more than once.
DECODE_ONCE = (
    "decode once per request: pass the decoded image along instead of re-opening or re-converting"
    " the same bytes in several steps"
)
#: preprocess: requests with several decode spans whose sizes cannot tell a repeat from several
#: images.
RECORD_DECODE_SIZES = (
    "record image.width, image.height and image.size on every decode span (otel_stages.imaging.decode"
    " does): they tell a second decode of the same image (decode once per request) from a request"
    " with several images"
)
#: preprocess from a source without per-request data (span-metric histograms).
NO_REQUEST_FACTS = [
    "if the inputs are JPEGs much larger than the model input, decode them in draft mode"
    " (imaging.decode(data, draft=(w, h)) or Pillow's Image.draft); otel-stages decode-bench IMAGE"
    " --size WxH measures the speed-up on your files",
    "report on the traces (not span metrics) for fixes from per-request data: repeated inputs,"
    " draft decoding estimates, the threads and event loop decode/resize ran on",
]


def draft_advice(d: DraftEstimate) -> str:
    """The draft-decoding fix with the estimate's numbers and the command that measures it."""
    w, _, h = d.target.partition("x")
    return (
        f"decode the large JPEGs in draft mode (imaging.decode(data, draft=({w}, {h})), or Pillow's"
        f" Image.draft('RGB', ({w}, {h})) before load()): {d.requests} warm"
        f" request{'s' if d.requests != 1 else ''} would decode an estimated {d.speedup:.1f}x faster"
        f" ({duration(d.saved_ms)} less decode time in all; most of it {d.source} -> {d.target},"
        f" decoded at 1/{d.scale} scale, so resize starts from 1/{d.scale * d.scale} of the pixels);"
        f" otel-stages decode-bench IMAGE --size {d.target} measures the same ratio on one of your"
        " files"
    )


def preprocess_fixes(facts: PreprocessFacts | None) -> list[str]:
    """The concrete fixes the facts support, most disruptive first: off the event loop, draft
    decoding, a cache for repeated inputs, decode once, a pool sized to the cores; then what to
    record when a fact is unknown. ``None`` (no per-request data): :data:`NO_REQUEST_FACTS`."""
    if facts is None:
        return list(NO_REQUEST_FACTS)
    lines = []
    t = facts.threads
    if t is not None and t.on_loop:
        lines.append(OFF_LOOP)
    if facts.draft is not None and facts.draft.worth:
        lines.append(draft_advice(facts.draft))
    rep = facts.repeats
    if rep is not None and rep.worth:
        lines.append(
            f"cache decoded images: {rep.requests} warm decode{'s' if rep.requests != 1 else ''}"
            f" ({pct(rep.share)} of decode time, {duration(rep.decode_ms)}) repeated an image the"
            " process had decoded before; if production traffic repeats images as this recording"
            " does, keep decoded (or resized) pixels in a small LRU keyed by a hash of the encoded"
            " bytes (or by URL when URLs are stable)")
    if facts.decoded_twice:
        lines.append(DECODE_ONCE)
    if facts.decodes_untold:
        lines.append(RECORD_DECODE_SIZES)
    if t is not None and not t.on_loop and t.several:
        lines.append(
            f"run decode/resize in one thread pool sized to the CPU cores, shared by all requests"
            f" (ThreadPoolExecutor(max_workers=os.cpu_count())): it ran on {t.threads} threads, and"
            " Pillow releases the GIL while decoding and resizing, so more threads than cores only"
            " slice the same cores between requests")
    if t is None or t.threads is None:
        lines.append(RECORD_THREADS)
    if facts.draft_missing:
        lines.append(record_draft_facts(facts.draft_missing))
    return lines
