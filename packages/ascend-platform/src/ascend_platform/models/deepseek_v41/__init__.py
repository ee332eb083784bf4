"""DeepSeek V4.1 (text model) on Ascend, rebuilt from vLLM's V4.1 parts with every op on `ascend_kernels`.

vLLM registers one V4.1 architecture, `DeepseekV41ForCausalLM`, as its CUDA/ROCm vision-language wrapper. The
worker registers `AscendDeepseekV41ForCausalLM` (the text model) under that name instead (`register_deepseek_v41`),
before the runner builds the model; see `ascend_core.upstream.deepseek_v41` for what it builds on.
"""

from __future__ import annotations

ARCHITECTURE = "DeepseekV41ForCausalLM"
QUALNAME = "ascend_platform.models.deepseek_v41.model:AscendDeepseekV41ForCausalLM"


def register_deepseek_v41() -> bool:
    """Make vLLM build `AscendDeepseekV41ForCausalLM` for V4.1 checkpoints in this process; False when the installed
    vLLM has nothing to build it on (start-up refused V4.1 models already)."""
    from ascend_core.upstream import deepseek_v41_unavailable_reason

    if deepseek_v41_unavailable_reason() is not None:
        return False
    from vllm import ModelRegistry

    from ascend_core.upstream import forget_resolved_model_architectures

    ModelRegistry.register_model(ARCHITECTURE, QUALNAME)
    forget_resolved_model_architectures()
    return True
