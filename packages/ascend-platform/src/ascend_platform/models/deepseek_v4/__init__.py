"""DeepSeek V4 on Ascend: vLLM's device-neutral (CPU) V4 implementation with its fused ops on `ascend_kernels`.

vLLM picks V4's implementation by device kind and gives an out-of-tree platform CUDA's, which cannot run here. The
worker registers `AscendDeepseekV4ForCausalLM` under V4's architecture name instead (`register_deepseek_v4`),
before the runner builds the model; see `ascend_core.upstream.deepseek_v4` for what it builds on.
"""

from __future__ import annotations

ARCHITECTURE = "DeepseekV4ForCausalLM"
QUALNAME = "ascend_platform.models.deepseek_v4.model:AscendDeepseekV4ForCausalLM"


def register_deepseek_v4() -> bool:
    """Make vLLM build `AscendDeepseekV4ForCausalLM` for V4 checkpoints in this process; False when the installed
    vLLM has nothing to build it on (start-up refused V4 models already)."""
    from ascend_core.upstream import deepseek_v4_unavailable_reason

    if deepseek_v4_unavailable_reason() is not None:
        return False
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, QUALNAME)
    return True
