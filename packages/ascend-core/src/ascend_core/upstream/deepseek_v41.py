"""What Ascend's DeepSeek V4.1 model builds on, and why it cannot run on the installed vLLM when it cannot.

vLLM's V4.1 (`vllm/models/deepseek_v41/`) is CUDA/ROCm-only as a model, but several of its parts are
device-neutral Python: the config class, the engram layout / compressed token map / hash multipliers
(`common/engram.py`), the weight loader and weights mapper of its text model (`nvidia/model.py`), and the KV specs.
Ascend's V4.1 model is rebuilt from those, V4's device-neutral MoE (`deepseek_v4_unavailable_reason`) and
`ascend_kernels`; on MRV2 it brings its own model state (`v1/worker/gpu/model_states`).
"""

from __future__ import annotations

# Modules Ascend's V4.1 classes import from (config, engram helpers, loader + mapper, MoE, MRV2 model state).
DEEPSEEK_V41_MODULES = (
    "vllm.transformers_utils.configs.deepseek_v41",
    "vllm.models.deepseek_v41.common.engram",
    "vllm.models.deepseek_v41.nvidia.model",
    "vllm.models.deepseek_v4.cpu.model",
    "vllm.v1.worker.gpu.model_states.default",
)


def deepseek_v41_unavailable_reason() -> str | None:
    """Why DeepSeek V4.1 cannot be built on the installed vLLM, or None."""
    from ascend_core.upstream.probes import module_exists
    from ascend_core.upstream.version import installed_vllm_version

    missing = [m for m in DEEPSEEK_V41_MODULES if not module_exists(m)]
    if not missing:
        return None
    return (f"vLLM {installed_vllm_version()} lacks the DeepSeek V4.1 parts Ascend's V4.1 model is built from "
            f"({', '.join(missing)} absent)")


def forget_resolved_model_architectures() -> bool:
    """Drop vLLM's per-process cache of resolved model classes (`model_loader.utils._MODEL_ARCH_BY_HASH`), so a
    class registered after the config resolved its architecture (the main process of an in-process engine resolves
    V4.1's to vLLM's CUDA wrapper while building the config) is the one the loader builds. False where that vLLM
    has no such cache (nothing to forget)."""
    from vllm.model_executor.model_loader import utils

    cache = getattr(utils, "_MODEL_ARCH_BY_HASH", None)
    if not isinstance(cache, dict):
        return False
    cache.clear()
    return True
