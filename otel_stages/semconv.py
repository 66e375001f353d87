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
#: int, tokens in the prompt (OpenTelemetry GenAI semantic conventions, incubating), on the request
#: span or any stage span; the report buckets it into input cohorts.
PROMPT_TOKENS = "gen_ai.usage.input_tokens"
#: str, the stage a span belongs to when its name carries per-request data (e.g. a span named
#: ``download /img/13.jpg`` with ``stage = download``); read by the report, never written here.
STAGE_NAME = "stage"

# --- decode / download attributes ------------------------------------------------------------
IMAGE_WIDTH = "image.width"  #: int, pixels, after EXIF orientation
IMAGE_HEIGHT = "image.height"  #: int, pixels, after EXIF orientation
IMAGE_SIZE = "image.size"  #: int, bytes of the encoded image
IMAGE_FORMAT = "image.format"  #: str, Pillow format name (``Image.format``), e.g. "JPEG"
IMAGE_MODE = "image.mode"  #: str, Pillow mode of the *source* image (``Image.mode``), e.g. "CMYK"

# --- resize attributes -----------------------------------------------------------------------
IMAGE_TARGET_WIDTH = "image.target_width"  #: int, pixels
IMAGE_TARGET_HEIGHT = "image.target_height"  #: int, pixels

# --- queue / forward attributes --------------------------------------------------------------
QUEUE_DEPTH = "queue.depth"  #: int, items already waiting when this one was enqueued
BATCH_SIZE = "batch.size"  #: int, items in the forward batch

# --- Standard OpenTelemetry keys we read -----------------------------------------------------
SERVICE_NAME = "service.name"  #: resource attribute
SERVICE_INSTANCE_ID = "service.instance.id"  #: resource attribute
URL_FULL = "url.full"  #: str, semconv HTTP client attribute (download)
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"  #: int (download)
ERROR_TYPE = "error.type"  #: str, semconv: class of the error that ended the span

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
