"""Every telemetry name otel_stages writes or reads, in one place.

Span names and attribute keys are this project's contract (``DESIGN.md`` section 2). GPU metric
names mirror the OpenTelemetry *hardware* semantic conventions (``hw.*``), which are still
incubating upstream (``opentelemetry.semconv._incubating.metrics.hw_metrics``), so they are copied
here as constants rather than imported from an unstable module.

Each constant's comment gives its type and unit.
"""

from __future__ import annotations

# --- Instrumentation scope -------------------------------------------------------------------
SCOPE_NAME = "otel_stages"  #: tracer / meter name

# --- Span names ------------------------------------------------------------------------------
SPAN_REQUEST = "request"  #: parent of the stage spans of one inference request
STAGE_DOWNLOAD = "download"  #: fetching the image bytes (network / remote storage)
STAGE_DECODE = "decode"  #: bytes -> pixels (Pillow decode + EXIF orientation + mode conversion)
STAGE_RESIZE = "resize"  #: pixels -> model input size / tensor
STAGE_QUEUE = "queue"  #: waiting for the executor / batch to pick the item up
STAGE_FORWARD = "forward"  #: the model call
#: preprocessing timed as one step (a stage map's preprocessing model: Triton ensembles, DALI)
STAGE_PREPROCESS = "preprocess"
#: One model call on a batch: its own trace (or a child of the executor's span, never of a member
#: request), ``batch.size`` set, a span link to every member request; each member's ``forward``
#: links back to it. Not a stage: the report reads it for batch sizes and fill waits.
SPAN_BATCH = "batch"

#: The standard stages, in pipeline order. Custom stage names are allowed in addition.
STANDARD_STAGES: tuple[str, ...] = (
    STAGE_DOWNLOAD,
    STAGE_DECODE,
    STAGE_RESIZE,
    STAGE_QUEUE,
    STAGE_FORWARD,
)

# --- Request span attributes -----------------------------------------------------------------
REQUEST_ID = "request.id"  #: str, caller-supplied or generated request id
REQUEST_SEQ = "request.seq"  #: int, 1-based order of requests in this process
REQUEST_COLD_START = "request.cold_start"  #: bool, first request of a process (or model load)
#: str, on a request span (and a local root kept at the head) exported by otel_stages' own sampler
#: (``OTEL_STAGES_SAMPLE_RATIO`` below 1): why it was kept. ``ratio`` (the trace-id ratio at the
#: head, or a local parent kept so: independent of how the request went, so an unbiased sample),
#: ``parent`` (a sampled remote caller's decision), ``cold`` (``request.cold_start``), ``slow``
#: (lasted ``slow_request_ms`` or more), ``error`` (a span with status ERROR); the last two are
#: late keeps. Not the OTel ``th`` tracestate threshold (consistent probability sampling): the
#: SDK's trace-id ratio sampler is not the consistent one, and a late keep has no threshold.
SAMPLING_KEPT = "otel_stages.sampling.kept"
#: float, 0..1, beside :data:`SAMPLING_KEPT`: the head ratio in force (``sample_ratio``)
SAMPLING_RATIO = "otel_stages.sampling.ratio"
#: :data:`SAMPLING_KEPT` values
KEPT_RATIO, KEPT_PARENT, KEPT_COLD, KEPT_SLOW, KEPT_ERROR = "ratio", "parent", "cold", "slow", "error"
#: int, tokens in the prompt (OpenTelemetry GenAI semantic conventions, incubating), on the request
#: span or any stage span; the report buckets it into input cohorts.
PROMPT_TOKENS = "gen_ai.usage.input_tokens"
#: every name a producer writes the prompt length under, first preferred: the OTel GenAI
#: semantic conventions' name, then the older one vLLM writes (vllm/tracing.py SpanAttributes
#: GEN_AI_USAGE_PROMPT_TOKENS)
PROMPT_TOKENS_NAMES: tuple[str, ...] = (PROMPT_TOKENS, "gen_ai.usage.prompt_tokens")
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"  #: tokens generated (OTel GenAI semconv)
#: every name a producer writes the output length under (vLLM: GEN_AI_USAGE_COMPLETION_TOKENS)
OUTPUT_TOKENS_NAMES: tuple[str, ...] = (OUTPUT_TOKENS, "gen_ai.usage.completion_tokens")
#: str, the stage a span belongs to when its name carries per-request data (e.g. a span named
#: ``download /img/13.jpg`` with ``stage = download``); read by the report, never written here.
STAGE_NAME = "stage"

# --- decode / download attributes ------------------------------------------------------------
IMAGE_WIDTH = "image.width"  #: int, pixels, after EXIF orientation
IMAGE_HEIGHT = "image.height"  #: int, pixels, after EXIF orientation
IMAGE_SIZE = "image.size"  #: int, bytes of the encoded image
IMAGE_FORMAT = "image.format"  #: str, Pillow format name (``Image.format``), e.g. "JPEG"
IMAGE_MODE = "image.mode"  #: str, Pillow mode of the *source* image (``Image.mode``), e.g. "CMYK"
IMAGE_DRAFT_SCALE = "image.draft_scale"  #: int, 1/2/4/8: JPEG decoded at 1/N size (Pillow draft)
#: str, declared media type of the encoded image: the HTTP ``Content-Type`` (parameters dropped)
#: or the media type of a ``data:`` URL, e.g. "image/jpeg" (download)
IMAGE_MEDIA_TYPE = "image.media_type"
IMAGE_FRAMES = "image.frames"  #: int, frames in an animated image (set only when more than 1)
IMAGE_FRAME_INDEX = "image.frame_index"  #: int, 0-based frame decoded from an animated image
#: str, description of the embedded ICC colour profile (``ImageCms.getProfileDescription``)
IMAGE_ICC_PROFILE = "image.icc_profile"
#: str, what decode did with that profile: "converted" (pixels converted to sRGB), "srgb" (already
#: sRGB: nothing to do) or "dropped" (the profile could not be applied and was discarded)
IMAGE_ICC_PROFILE_ACTION = "image.icc_profile.action"
ICC_CONVERTED, ICC_SRGB, ICC_DROPPED = "converted", "srgb", "dropped"

# --- resize attributes -----------------------------------------------------------------------
IMAGE_TARGET_WIDTH = "image.target_width"  #: int, pixels
IMAGE_TARGET_HEIGHT = "image.target_height"  #: int, pixels

# --- where decode / resize ran (decode, resize) -----------------------------------------------
#: str, semconv general attribute: name of the thread that did the work (``threading`` name)
THREAD_NAME = "thread.name"
#: bool, true when an asyncio event loop was running on the thread that did the work
#: (``asyncio.get_running_loop()`` succeeded): CPU work there stalls every other coroutine
EVENT_LOOP_RUNNING = "otel_stages.event_loop.running"

# --- queue / forward attributes --------------------------------------------------------------
QUEUE_DEPTH = "queue.depth"  #: int, items already waiting when this one was enqueued
BATCH_SIZE = "batch.size"  #: int, items in the forward batch

# --- Stage spans made by a stage map (report --stage-map) -------------------------------------
#: string, on stage spans a stage map made: where the time came from ("events QUEUE_START ->
#: COMPUTE_START", "attribute gen_ai.latency.time_in_queue (s)", "span compute")
STAGE_MAP_SOURCE = "otel_stages.stage_map.source"

# --- Standard OpenTelemetry keys we read -----------------------------------------------------
SERVICE_NAME = "service.name"  #: resource attribute
SERVICE_NAMESPACE = "service.namespace"  #: resource attribute
SERVICE_INSTANCE_ID = "service.instance.id"  #: resource attribute
#: str resource attribute: the version of the service (OpenTelemetry service conventions), which
#: tells a deploy during the recording from a slower replica (the process mix)
SERVICE_VERSION = "service.version"
HOST_NAME = "host.name"  #: resource attribute (OpenTelemetry host conventions)
#: int resource attribute: the process id (OpenTelemetry process conventions; the Java and Node
#: SDKs set it by default), which tells a server's worker processes apart on one host.
PROCESS_PID = "process.pid"
URL_FULL = "url.full"  #: str, semconv HTTP client attribute (download), secrets redacted
URL_SCHEME = "url.scheme"  #: str, semconv: "http", "https" or "data" (download)
#: str, semconv: host the body finally came from (after redirects) (download)
SERVER_ADDRESS = "server.address"
#: int, semconv: redirects followed before the body came (download; set when > 0)
HTTP_REQUEST_RESEND_COUNT = "http.request.resend_count"
EXCEPTION_TYPE = "exception.type"  #: str, semconv exception event attribute (module.qualname)
EXCEPTION_MESSAGE = "exception.message"  #: str, semconv exception event attribute (capped)
EXCEPTION_STACKTRACE = "exception.stacktrace"  #: str, semconv exception event attribute (capped)
EXCEPTION_ESCAPED = "exception.escaped"  #: str "True"/"False", as the SDK's record_exception sets it
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"  #: int (download)
ERROR_TYPE = "error.type"  #: str, semconv: class of the error that ended the span

# --- Telemetry about the telemetry ------------------------------------------------------------
#: bool, true on a span otel_stages ended itself because it was still open when telemetry shut
#: down (process exit, ``Telemetry.shutdown()``): its end time is the shutdown, not the work's end
OTEL_STAGES_INTERRUPTED = "otel_stages.interrupted"
#: counter, unit "{span}": spans that never reached the exporter's destination, by ``error.type``
SPANS_DROPPED = "otel_stages.spans.dropped"
UNIT_SPANS = "{span}"
#: ``error.type`` values of :data:`SPANS_DROPPED` (and keys of ``Telemetry.drops``)
DROP_QUEUE_FULL = "queue_full"  #: the batch queue was full (export slower than spans came)
DROP_EXPORT_FAILED = "export_failed"  #: the exporter gave up on the batch (after its own retries)
DROP_SHUTDOWN_TIMEOUT = "shutdown_timeout"  #: still queued or in flight when shutdown's time ran out
DROP_AFTER_SHUTDOWN = "already_shutdown"  #: ended after its provider was shut down
DROP_REASONS: tuple[str, ...] = (DROP_QUEUE_FULL, DROP_EXPORT_FAILED, DROP_SHUTDOWN_TIMEOUT,
                                 DROP_AFTER_SHUTDOWN)

# --- GPU metrics (OpenTelemetry hardware semantic conventions) --------------------------------
HW_GPU_UTILIZATION = "hw.gpu.utilization"  #: gauge, unit "1", 0..1 (NVML percent / 100)
HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"  #: gauge, unit "By" (NVML memory info v2 ``used``)
HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"  #: gauge, unit "By" (NVML memory info v2 ``total``)
HW_POWER = "hw.power"  #: gauge, unit "W" (NVML milliwatts / 1000)
HW_TEMPERATURE = "hw.temperature"  #: gauge, unit "Cel" (NVML degrees C)

#: gauge, unit "1", 0..1: fraction of SMs busy, from GPM (Hopper and newer, also per MIG slice).
#: Not in the hardware semantic conventions, hence the vendor prefix.
NVIDIA_GPU_SM_ACTIVITY = "nvidia.gpu.sm.activity"

UNIT_RATIO = "1"
UNIT_BYTES = "By"
UNIT_WATTS = "W"
UNIT_CELSIUS = "Cel"

# GPU metric attributes (hardware semantic conventions)
HW_ID = "hw.id"  #: str, GPU UUID as NVML reports it ("GPU-..." or "MIG-...")
HW_TYPE = "hw.type"  #: str, always "gpu" here
#: str on ``hw.gpu.utilization``: the engine a point describes, ``decoder`` / ``encoder`` /
#: ``general`` (OpenTelemetry hardware GPU conventions); the model runs on ``general``.
HW_GPU_TASK = "hw.gpu.task"
HW_GPU_TASK_GENERAL = "general"
HW_TYPE_GPU = "gpu"
HW_VENDOR = "hw.vendor"  #: str, "NVIDIA"
HW_MODEL = "hw.model"  #: str, NVML device name, e.g. "NVIDIA H200"

# --- Per-forward GPU attribution (set on the forward span when it ends) ---------------------
GPU_UTILIZATION_MEAN = "gpu.utilization.mean"  #: float, 0..1, mean of samples inside the span
GPU_UTILIZATION_MAX = "gpu.utilization.max"  #: float, 0..1
GPU_MEMORY_USAGE_MAX = "gpu.memory.usage.max"  #: int, bytes, max memory used inside the span
GPU_BUSY_AT_START = "gpu.busy_at_start"  #: bool, GPU already busy when the forward began
GPU_SAMPLE_COUNT = "gpu.sample_count"  #: int, samples that back the figures above
GPU_DEVICE_TIME_MS = "gpu.device_time_ms"  #: float, ms, device time measured with CUDA events

# --- Why a stage was slow: per-stage signals (otel_stages.signals) ---------------------------
# Thread CPU time has no semantic-convention name for spans (semconv has it only as the process /
# container metrics ``process.cpu.time``, ``container.cpu.time``); ``thread.*`` is the namespace
# the conventions use for the executing thread (``thread.id``, ``thread.name``).
#: float, ms: CPU time of the thread that ran the stage, from ``time.thread_time_ns()`` read at
#: stage start and end (user + system time of that thread only)
THREAD_CPU_TIME_MS = "thread.cpu_time_ms"
#: float, 0..1: ``thread.cpu_time_ms`` / the span's duration; low = the thread was not running
#: (waiting for a core, the GIL, a lock, I/O or the GPU). Named after semconv's
#: ``process.cpu.utilization`` (CPU time over elapsed time).
THREAD_CPU_UTILIZATION = "thread.cpu_utilization"
#: float, ms: time the thread that ran the stage was runnable but waiting for a core (in a run
#: queue), from ``run_delay``, the second field of Linux ``/proc/thread-self/schedstat`` (kernel
#: Documentation/scheduler/sched-stats.rst), read at stage start and end; opt-in
#: (``configure(run_queue=True)``). No semantic convention exists for it.
THREAD_RUN_QUEUE_WAIT_MS = "otel_stages.thread.run_queue_wait_ms"
#: float, ms: time CPython's garbage collector ran while the span was open (all collections,
#: any thread: a collection holds the GIL), clipped to the span
GC_PAUSE_MS = "otel_stages.gc.pause_ms"
#: int: garbage collections that ran while the span was open
GC_COLLECTIONS = "otel_stages.gc.collections"
#: span event: one collection of at least ``signals.GC_EVENT_MIN_MS`` while the span was open;
#: its time is the collection's start (it may precede the span)
EVENT_GC_PAUSE = "cpython.gc.pause"
#: int, semconv (``cpython.gc.*`` runtime conventions): the generation collected, 0..2
CPYTHON_GC_GENERATION = "cpython.gc.generation"
#: float, ms: duration of the whole collection (on the ``cpython.gc.pause`` event)
GC_DURATION_MS = "otel_stages.gc.duration_ms"
#: bool, on a ``cpython.gc.pause`` event: the collection had run but its stop callback had not
#: when the stage ended (the collector was switched out), so ``otel_stages.gc.duration_ms`` is
#: the time up to the stage's end: an upper bound
GC_IN_PROGRESS = "otel_stages.gc.in_progress"
#: float, ms: asyncio event-loop lag measured while the span was open, on a span that ran on the
#: loop's thread: the sum of how late the loop monitor's ticks ran (the loop was busy elsewhere)
EVENT_LOOP_LAG_MS = "otel_stages.event_loop.lag_ms"
#: float, ms: the span ran on the event loop's thread for at least 25 ms without yielding to the
#: loop (the loop did not turn: exact on selector loops; elsewhere no monitor tick although one
#: was due), so the loop could not run anything else: the span held the loop this long
EVENT_LOOP_HELD_MS = "otel_stages.event_loop.held_ms"

# --- cgroup CPU quota and throttling (names of the Collector's docker_stats receiver,
# receiver/dockerstatsreceiver/metadata.yaml in opentelemetry-collector-contrib; no semconv yet)
#: cumulative monotonic sum, unit "ns" (int): time the cgroup was throttled (cpu.stat
#: ``throttled_usec`` x 1000 in cgroup v2, ``throttled_time`` in v1)
CONTAINER_CPU_THROTTLED_TIME = "container.cpu.throttling_data.throttled_time"
#: cumulative monotonic sum, unit "{periods}" (int): enforcement periods elapsed (``nr_periods``)
CONTAINER_CPU_PERIODS = "container.cpu.throttling_data.periods"
#: cumulative monotonic sum, unit "{periods}" (int): periods in which the quota ran out
#: (``nr_throttled``)
CONTAINER_CPU_THROTTLED_PERIODS = "container.cpu.throttling_data.throttled_periods"
#: gauge, unit "{cpus}" (float): the CPU quota, quota / period (cgroup v2 ``cpu.max``, v1
#: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); no point when there is no quota
CONTAINER_CPU_LIMIT = "container.cpu.limit"
UNIT_NANOSECONDS = "ns"
UNIT_PERIODS = "{periods}"
UNIT_CPUS = "{cpus}"

# --- CPU pressure stall information (Linux PSI, kernel Documentation/accounting/psi.rst) --------
# No semantic convention is merged yet (semantic-conventions @ 384d661, 2026-08: no PSI metric).
# The names are those of the latest proposal, open-telemetry/semantic-conventions PR #3528 (after
# #2996 and #3068, which proposed ``system.linux.psi.total_time``): per resource a cumulative
# counter ``system.{cpu,memory,io,irq}.linux.pressure.total`` in seconds, with the attribute
# ``system.linux.pressure.stall_type`` (``some`` | ``full``).
#: cumulative monotonic sum, unit "s" (float): time in which at least one task of the process's
#: cgroup (cgroup v2 ``cpu.pressure``; else of the host, ``/proc/pressure/cpu``) was runnable but
#: waiting for a core: the ``some`` line's ``total=`` (µs) / 1e6
SYSTEM_CPU_PRESSURE_TOTAL = "system.cpu.linux.pressure.total"
#: string attribute on the pressure points: ``some`` (what otel_stages records) or ``full``
SYSTEM_LINUX_PRESSURE_STALL_TYPE = "system.linux.pressure.stall_type"
PRESSURE_STALL_SOME = "some"
#: string attribute on otel_stages' pressure points (no convention: otel_stages' own): which file
#: the sampler read, ``cgroup`` (the process's cgroup v2 ``cpu.pressure``: its own tasks) or
#: ``host`` (``/proc/pressure/cpu``: every task of the host). Points without it count as ``host``.
PRESSURE_SCOPE = "otel_stages.pressure.scope"
PRESSURE_SCOPE_CGROUP = "cgroup"
PRESSURE_SCOPE_HOST = "host"
UNIT_SECONDS = "s"
