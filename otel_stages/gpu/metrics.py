"""The one table of GPU metrics: name, unit, instrument, raw NVML source and conversion.

The sampler converts raw backend readings with :meth:`MetricSpec.convert`; the exporter
(:mod:`otel_stages.gpu.reader`) turns each table row into one OTLP gauge whose data points are
the individual samples, each at the time it was taken (see that module for why it does not use
SDK instruments). Names and units come from :mod:`otel_stages.semconv` (OpenTelemetry hardware
semantic conventions). No OpenTelemetry SDK import here.
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_stages import semconv

GPU_SM_ACTIVITY = semconv.NVIDIA_GPU_SM_ACTIVITY


@dataclass(frozen=True)
class MetricSpec:
    """One exported GPU metric.

    ``name`` / ``unit``: OTLP metric name and UCUM unit; ``instrument``: OTLP data kind
    (always ``"gauge"`` here: every point is an independent sample); ``source``: the NVML call
    and field the raw value comes from; ``scale``: raw value * scale = exported value;
    ``integer``: export as ``asInt`` (bytes) instead of ``asDouble``; ``ring``: the value comes
    from the driver's timestamped sample ring when it has one (utilization only).
    """

    name: str
    unit: str
    description: str
    source: str
    scale: float = 1.0
    integer: bool = False
    ring: bool = False
    instrument: str = "gauge"

    def convert(self, raw: float) -> float | int:
        """Raw NVML value -> exported value (e.g. percent -> 0..1, mW -> W, bytes as int)."""
        value = raw * self.scale
        return int(value) if self.integer else float(value)


SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(semconv.HW_GPU_UTILIZATION, semconv.UNIT_RATIO,
               "Fraction of time one or more kernels ran on the GPU over the driver's sample period",
               "nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES), else "
               "nvmlDeviceGetUtilizationRates().gpu; percent", scale=0.01, ring=True),
    MetricSpec(semconv.HW_GPU_MEMORY_USAGE, semconv.UNIT_BYTES, "GPU memory used",
               "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).used, else v1 .used (which counts "
               "driver-reserved memory as used); bytes", integer=True),
    MetricSpec(semconv.HW_GPU_MEMORY_LIMIT, semconv.UNIT_BYTES, "GPU memory size",
               "nvmlDeviceGetMemoryInfo(...).total; bytes", integer=True),
    MetricSpec(semconv.HW_POWER, semconv.UNIT_WATTS, "Power drawn by the GPU board",
               "nvmlDeviceGetPowerUsage(); milliwatts", scale=0.001),
    MetricSpec(semconv.HW_TEMPERATURE, semconv.UNIT_CELSIUS, "GPU core temperature",
               "nvmlDeviceGetTemperatureV / nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU); "
               "degrees C"),
    MetricSpec(GPU_SM_ACTIVITY, semconv.UNIT_RATIO,
               "Fraction of SMs busy between two GPM samples (Hopper and newer)",
               "nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_UTIL) between consecutive "
               "nvmlGpmSampleGet / nvmlGpmMigSampleGet; percent", scale=0.01),
)

BY_NAME: dict[str, MetricSpec] = {s.name: s for s in SPECS}
UTILIZATION = BY_NAME[semconv.HW_GPU_UTILIZATION]
#: Metrics read as instant values every sampler pass (everything but the ring).
POINT_METRICS: tuple[str, ...] = tuple(s.name for s in SPECS if not s.ring)


def device_attributes(uuid: str, model: str) -> dict[str, str]:
    """The ``hw.*`` attributes of every point of one device (DESIGN.md section 2)."""
    return {
        semconv.HW_ID: uuid,
        semconv.HW_TYPE: semconv.HW_TYPE_GPU,
        semconv.HW_VENDOR: "NVIDIA",
        semconv.HW_MODEL: model,
    }
