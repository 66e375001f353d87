"""GPU telemetry from NVML: ``hw.gpu.*`` samples on the span clock, per-forward attribution.

``configure()`` starts it (setting ``gpu``: ``auto`` / ``on`` / ``off``, ``OTEL_STAGES_GPU``;
``gpu_interval_s``, ``OTEL_STAGES_GPU_INTERVAL_S``). For applications:

- :func:`set_model_device` names the GPU that runs the model when there are several;
- :func:`cuda_stage` is a ``forward`` stage that also measures GPU time with CUDA events.

Modules: ``backend`` (the 4-method interface + a pure-Python fake), ``nvml`` (the only NVML
caller), ``timebase`` (sample clock domains), ``store``, ``sampler``, ``metrics`` (the metric
table), ``attribution`` (forward hook), ``cuda``, ``reader`` / ``session`` (SDK wiring, imported
by ``otel_stages.sdk`` only), ``live`` (``otel-stages gpu``). Importing this package imports
neither ``pynvml`` nor the OpenTelemetry SDK.
"""

from __future__ import annotations

from otel_stages.gpu.attribution import set_model_device
from otel_stages.gpu.cuda import cuda_stage

__all__ = ["cuda_stage", "set_model_device"]
