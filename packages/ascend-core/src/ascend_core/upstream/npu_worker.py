"""Whether the installed vLLM's GPU `Worker` offers what Ascend's NPU worker builds on (the device lane only).

`NPUWorker.init_device` does what vLLM 0.32's `Worker.init_device` does: the memory snapshot, `request_memory(...,
external_weight_memory)`, then `_init_workspace_and_model_runner`, whose `_make_model_runner` it overrides. A vLLM
without those (the legacy lane, 0.27.1) cannot host it: the device lane refuses to start there, naming what is missing.
"""

from __future__ import annotations

import inspect

from ascend_core.upstream.version import installed_vllm_version


def npu_worker_unavailable_reason() -> str | None:
    """What the installed vLLM lacks for the NPU worker, or None."""
    from vllm.v1.worker import utils as worker_utils
    from vllm.v1.worker.gpu_worker import Worker

    missing = [f"Worker.{name}" for name in ("_init_workspace_and_model_runner", "_make_model_runner")
               if not hasattr(Worker, name)]
    request_memory = getattr(worker_utils, "request_memory", None)
    if request_memory is None:
        missing.append("vllm.v1.worker.utils.request_memory")
    elif "external_weight_memory" not in inspect.signature(request_memory).parameters:
        missing.append("request_memory(external_weight_memory=...)")
    if not missing:
        return None
    return f"vLLM {installed_vllm_version()}: Ascend's NPU worker needs what this vLLM lacks: {', '.join(missing)}"
