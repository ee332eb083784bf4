"""Gated delta-net (linear attention) layers of Qwen3-Next / Qwen3.5 hybrids on `ascend_kernels`.

vLLM picks the layer's forward by device kind (CPU, XPU, ROCm, else CUDA's Triton/FLA kernels), so an out-of-tree
platform gets CUDA's, which cannot run here. The worker registers `AscendQwenGatedDeltaNetAttention` out of tree in
place of vLLM's `QwenGatedDeltaNetAttention` (`register_qwen_gdn`) before the runner builds a model that has
linear-attention layers; it keeps vLLM's projections, norm and state spec and runs the conv and the gated delta rule
through the kernel facade (`ascend_kernels.ops_gdn`).
"""

from __future__ import annotations

LAYER_NAME = "QwenGatedDeltaNetAttention"
_registered = False


def has_linear_attention(hf_text_config) -> bool:
    """Whether the model interleaves gated delta-net layers (`layer_types` naming "linear_attention")."""
    return "linear_attention" in (getattr(hf_text_config, "layer_types", None) or ())


def register_qwen_gdn() -> bool:
    """Register the Ascend GDN layer with vLLM once per process; False when it already was."""
    global _registered
    if _registered:
        return False
    from vllm.model_executor.custom_op import PluggableLayer

    from ascend_platform.models.qwen_gdn.layer import AscendQwenGatedDeltaNetAttention

    PluggableLayer.register_oot(AscendQwenGatedDeltaNetAttention, name=LAYER_NAME)
    _registered = True
    return True
