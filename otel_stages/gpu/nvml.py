"""The one place that calls NVML (through the ``nvidia-ml-py`` bindings, module ``pynvml``).

:class:`NvmlBackend` implements :class:`~otel_stages.gpu.backend.GpuBackend`:

- ``pynvml`` is imported and ``nvmlInit`` called only in :meth:`NvmlBackend.open` (the sampler runs
  it off the request path, with a timeout);
- devices are keyed by UUID; MIG instances of a GPU in MIG mode are listed as their own devices;
- NVML's NOT_SUPPORTED / FUNCTION_NOT_FOUND become "not supported" values, NOT_FOUND from the
  sample ring means "nothing new"; other errors raise :class:`GpuReadError`;
- a missing library, a driver/library version mismatch and the like raise
  :class:`GpuUnavailable` with one actionable sentence;
- device names and UUIDs that are not valid UTF-8 are decoded with replacement characters;
- after ``fork()`` the child re-initialises (:func:`reset_after_fork`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from typing import Any

from otel_stages import semconv
from otel_stages.gpu.backend import NOT_SUPPORTED, Device, GpuReadError, GpuUnavailable, RawSample
from otel_stages.gpu.metrics import GPU_SM_ACTIVITY

logger = logging.getLogger("otel_stages.gpu")

_INIT_ADVICE = {
    # NVML error name -> what to do about it
    "LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found (install the NVIDIA driver, or run the "
                         "container with --gpus / the NVIDIA container toolkit)",
    "DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded (check nvidia-smi; load the "
                         "nvidia kernel module)",
    "LIB_RM_VERSION_MISMATCH": "driver/library version mismatch: libnvidia-ml.so.1 does not match "
                               "the loaded kernel driver (reboot, or reload the nvidia kernel "
                               "module after the driver upgrade)",
    "NO_PERMISSION": "no permission to open the GPU device files /dev/nvidia* (run as a user in "
                     "the video group or pass the devices to the container)",
    "FUNCTION_NOT_FOUND": "libnvidia-ml.so.1 is older than these nvidia-ml-py bindings expect "
                          "(update the NVIDIA driver)",
}


def _import_bindings() -> tuple[Any, ImportError | None]:
    try:
        import pynvml  # pure Python + ctypes: loads no library, talks to no driver
    except ImportError as exc:
        return None, exc
    return pynvml, None


def _error_name(nvml: Any, exc: Exception) -> str:
    value = getattr(exc, "value", None)
    for name in _INIT_ADVICE:
        if value == getattr(nvml, f"NVML_ERROR_{name}", object()):
            return name
    return ""


def _text(fn: Any, *args: Any) -> str:
    """Call a pynvml string getter; bytes that are not UTF-8 are replaced, not fatal."""
    try:
        value = fn(*args)
    except UnicodeDecodeError as exc:  # pynvml decodes strictly: recover the raw bytes
        return bytes(exc.object).decode("utf-8", "replace")
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """:class:`GpuBackend` over NVML. Not fork-safe by itself: see :func:`reset_after_fork`."""

    def __init__(self) -> None:
        # Import here, on the configuring thread: an import still running on the init thread
        # when the process forks would leave the child's import lock held forever.
        self._module, self._import_error = _import_bindings()
        self._nvml: Any = None
        self._memory_v1: set[str] = set()  # devices whose driver lacks nvmlDeviceGetMemoryInfo_v2
        self._temperature_v: bool | None = None  # nvmlDeviceGetTemperatureV available?
        self._gpm: dict[str, list[Any] | None] = {}  # uuid -> [previous sample, current] / None
        self.driver_version: str | None = None

    # -- GpuBackend ----------------------------------------------------------------------------
    def open(self) -> list[Device]:
        """``nvmlInit`` + enumerate GPUs (and MIG instances). Raises :class:`GpuUnavailable`."""
        nvml = self._module
        if nvml is None:
            raise GpuUnavailable(f"nvidia-ml-py is not installed ({self._import_error}); "
                                 "pip install nvidia-ml-py")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            name = _error_name(nvml, exc)
            raise GpuUnavailable(_INIT_ADVICE.get(name) or f"nvmlInit failed: {exc} "
                                 f"(NVML error {getattr(exc, 'value', '?')})") from None
        self._nvml = nvml
        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion)
        except nvml.NVMLError:
            self.driver_version = None
        try:
            return self._enumerate(nvml)
        except nvml.NVMLError as exc:
            self.close()
            raise GpuUnavailable(f"listing GPUs failed: {exc}") from None

    def _enumerate(self, nvml: Any) -> list[Device]:
        devices: list[Device] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu = Device(_text(nvml.nvmlDeviceGetUUID, handle), _text(nvml.nvmlDeviceGetName, handle),
                             index, handle=handle)
            except nvml.NVMLError as exc:  # one broken GPU (lost, no permission) is skipped
                logger.warning("GPU at NVML index %d skipped: %s", index, exc)
                continue
            devices.append(gpu)
            devices.extend(self._mig_devices(nvml, gpu))
        for device in devices:
            self._gpm[device.uuid] = self._gpm_prime(device)
        return devices

    def _mig_devices(self, nvml: Any, gpu: Device) -> list[Device]:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(gpu.handle)
            if current != nvml.NVML_DEVICE_MIG_ENABLE:
                return []
            count = nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)
        except nvml.NVMLError:  # NOT_SUPPORTED (no MIG on this GPU), old driver
            return []
        out = []
        for slot in range(count):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
                out.append(Device(_text(nvml.nvmlDeviceGetUUID, handle),
                                  _text(nvml.nvmlDeviceGetName, handle),
                                  gpu.index, parent_uuid=gpu.uuid, handle=handle))
            except nvml.NVMLError:  # NOT_FOUND: empty slot
                continue
        return out

    def utilization_samples(self, device: Device, since_us: int) -> list[RawSample] | Any:
        """``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, lastSeen=since_us)``."""
        nvml = self._nvml
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(device.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                            since_us)
        except nvml.NVMLError_NotFound:  # nothing newer than since_us (e.g. idle GPU)
            return []
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return NOT_SUPPORTED
        except nvml.NVMLError as exc:
            raise GpuReadError(f"nvmlDeviceGetSamples: {exc}") from None
        field_name = _VALUE_FIELDS.get(value_type, "uiVal")
        out = [RawSample(int(s.timeStamp), float(getattr(s.sampleValue, field_name))) for s in samples]
        out.sort(key=lambda s: s.timestamp_us)
        return out

    def read(self, device: Device, metrics: Collection[str]) -> dict[str, float]:
        """Instant readings in raw units (percent, bytes, mW, degrees C); unsupported ones absent."""
        out: dict[str, float] = {}
        for name in metrics:
            if name == semconv.HW_GPU_MEMORY_LIMIT and semconv.HW_GPU_MEMORY_USAGE in metrics:
                continue  # read together with usage below
            reader = _READERS.get(name)
            if reader is None:
                continue
            try:
                value: Any = reader(self, device)
            except (self._nvml.NVMLError_NotSupported, self._nvml.NVMLError_FunctionNotFound):
                continue
            except self._nvml.NVMLError as exc:
                raise GpuReadError(f"{name}: {exc}") from None
            if isinstance(value, dict):
                out.update({k: v for k, v in value.items() if k in metrics})
            elif value is not NOT_SUPPORTED:
                out[name] = value
        return out

    def close(self) -> None:
        """Free GPM samples, then ``nvmlShutdown``."""
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        for pair in self._gpm.values():
            for sample in pair or ():
                try:
                    nvml.nvmlGpmSampleFree(sample)
                except nvml.NVMLError:
                    pass
        self._gpm.clear()
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            logger.debug("nvmlShutdown failed: %s", exc)

    # -- individual readings ---------------------------------------------------------------------
    def _utilization(self, device: Device) -> float:
        return float(self._nvml.nvmlDeviceGetUtilizationRates(device.handle).gpu)

    def _memory(self, device: Device) -> dict[str, float]:
        nvml = self._nvml
        if device.uuid not in self._memory_v1:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(device.handle, version=nvml.nvmlMemory_v2)
                return {semconv.HW_GPU_MEMORY_USAGE: info.used, semconv.HW_GPU_MEMORY_LIMIT: info.total}
            except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NotSupported,
                    nvml.NVMLError_ArgumentVersionMismatch) as exc:
                self._memory_v1.add(device.uuid)
                logger.info("GPU %s: nvmlDeviceGetMemoryInfo_v2 unavailable (%s); memory used comes "
                            "from the v1 call, which counts driver-reserved memory as used", device.uuid, exc)
        info = nvml.nvmlDeviceGetMemoryInfo(device.handle)
        return {semconv.HW_GPU_MEMORY_USAGE: info.used, semconv.HW_GPU_MEMORY_LIMIT: info.total}

    def _power(self, device: Device) -> float:
        return float(self._nvml.nvmlDeviceGetPowerUsage(device.handle))  # milliwatts

    def _temperature(self, device: Device) -> float:
        nvml = self._nvml
        if self._temperature_v is not False:
            try:
                value = float(nvml.nvmlDeviceGetTemperatureV(device.handle, nvml.NVML_TEMPERATURE_GPU))
                self._temperature_v = True
                return value
            except (nvml.NVMLError_FunctionNotFound, AttributeError):  # older driver / bindings
                self._temperature_v = False
        return float(nvml.nvmlDeviceGetTemperature(device.handle, nvml.NVML_TEMPERATURE_GPU))

    def _gpm_prime(self, device: Device) -> list[Any] | None:
        """Allocate two GPM samples and take the first, or ``None`` when GPM is unsupported
        (pre-Hopper GPU, old driver: the first reading then needs no previous sample)."""
        nvml = self._nvml
        try:
            probe = nvml.nvmlGpmQueryDeviceSupport(self._parent(device) if device.is_mig else device.handle)
            if not probe.isSupportedDevice:
                return None
            pair = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            self._gpm_sample(device, pair[0])
            return pair
        except (nvml.NVMLError, AttributeError) as exc:  # AttributeError: bindings without GPM
            logger.debug("GPU %s: no GPM SM activity (%s)", device.uuid, exc)
            return None

    def _sm_activity(self, device: Device) -> float | Any:
        """GPM SM utilization (percent) between this call and the previous one."""
        nvml = self._nvml
        pair = self._gpm.get(device.uuid)
        if pair is None:
            return NOT_SUPPORTED
        self._gpm_sample(device, pair[1])
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = pair[0], pair[1]
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        nvml.nvmlGpmMetricsGet(request)
        pair.reverse()  # the current sample is the next call's previous one
        metric = request.metrics[0]
        return float(metric.value) if metric.nvmlReturn == nvml.NVML_SUCCESS else NOT_SUPPORTED

    def _gpm_sample(self, device: Device, sample: Any) -> None:
        nvml = self._nvml
        if device.is_mig:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceId(device.handle)
            nvml.nvmlGpmMigSampleGet(self._parent(device), gpu_instance, sample)
        else:
            nvml.nvmlGpmSampleGet(device.handle, sample)

    def _parent(self, device: Device) -> Any:
        return self._nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device.handle)


_READERS = {
    semconv.HW_GPU_UTILIZATION: NvmlBackend._utilization,
    semconv.HW_GPU_MEMORY_USAGE: NvmlBackend._memory,
    semconv.HW_GPU_MEMORY_LIMIT: NvmlBackend._memory,
    semconv.HW_POWER: NvmlBackend._power,
    semconv.HW_TEMPERATURE: NvmlBackend._temperature,
    GPU_SM_ACTIVITY: NvmlBackend._sm_activity,
}

# nvmlValueType_t -> field of c_nvmlValue_t (NVML_VALUE_TYPE_DOUBLE = 0 ... SIGNED_INT = 5)
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def reset_after_fork() -> None:
    """In a forked child: give ``pynvml`` a fresh library lock (a parent thread may have held it
    at fork time and will never release it). NVML itself is re-initialised by a new backend."""
    import sys

    pynvml = sys.modules.get("pynvml")
    if pynvml is not None and hasattr(pynvml, "libLoadLock"):
        setattr(pynvml, "libLoadLock", threading.Lock())  # noqa: B010 - not in the stubs
