"""What Ascend's DeepSeek V4 model builds on, and why it cannot run on the installed vLLM when it cannot.

vLLM 0.32 ships V4 (`vllm/models/deepseek_v4/`) with one implementation per device kind, picked by
`current_platform.is_cuda()/is_rocm()/is_xpu()/is_cpu()`; an out-of-tree platform gets CUDA's. The device-neutral
one is the CPU implementation: eager PyTorch around a handful of fused ops, Triton-free metadata builders for the
sparse-MLA and indexer caches. Ascend's model subclasses it and replaces those fused ops with `ascend_kernels`'.
DeepSeek V4.1 (`vllm/models/deepseek_v41/`) has no such implementation (CUDA and ROCm only).
"""

from __future__ import annotations

# The CPU implementation's modules Ascend's V4 classes subclass (model, attention + indexer, compressor, backends).
DEEPSEEK_V4_MODULES = (
    "vllm.models.deepseek_v4.cpu.model",
    "vllm.models.deepseek_v4.cpu.cpu_sparse",
    "vllm.models.deepseek_v4.cpu.cpu_compressor",
    "vllm.models.deepseek_v4.cpu.cpu_mla",
    "vllm.v1.attention.backends.mla.sparse_swa",
)


def deepseek_v4_unavailable_reason() -> str | None:
    """Why DeepSeek V4 cannot be built on the installed vLLM (no device-neutral V4 implementation), or None."""
    from ascend_core.upstream.probes import module_exists
    from ascend_core.upstream.version import installed_vllm_version

    missing = [m for m in DEEPSEEK_V4_MODULES if not module_exists(m)]
    if not missing:
        return None
    return (f"vLLM {installed_vllm_version()} has no device-neutral DeepSeek V4 implementation "
            f"({', '.join(missing)} absent)")
