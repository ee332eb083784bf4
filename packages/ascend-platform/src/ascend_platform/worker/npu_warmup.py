"""The NPU worker's warm-up: vLLM's GPU `Worker.compile_or_warm_up_model` minus its CUDA kernel warm-ups.

`compile_or_warm_up_model` calls `kernel_warmup(worker)` (FlashInfer autotuning, DeepGEMM, CuTe-DSL GEMMs,
MiniMax-M3 sparse attention ...), which imports CUDA-only model code and tunes kernels an NPU does not run. The rest
of the method (compile-size warm-up runs, graph capture, the KV-memory suggestion) is the device lane's. So the call
is replaced for the duration of the NPU worker's warm-up only, through the registered patch `worker.npu_kernel_warmup`
(declared in `patches.catalogue`).
"""

from __future__ import annotations

from typing import Any

from ascend_platform.patches.catalogue import NPU_KERNEL_WARMUP

KERNEL_WARMUP = NPU_KERNEL_WARMUP  # declared in patches.catalogue


def skip_cuda_kernel_warmup(worker: Any, **kwargs: Any) -> None:
    """The NPU's kernels need no autotuning pass (ACL compiles per shape at first launch)."""
