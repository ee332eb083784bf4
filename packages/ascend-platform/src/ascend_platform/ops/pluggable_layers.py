"""Out-of-tree layers the Ascend platform plugs into vLLM: routed experts, their MoE method, the logits processor.

Unlike the optional custom ops (`custom_ops`), these are always registered: on an out-of-tree platform vLLM's own
MoE method selects no kernel, so a MoE model cannot run without ours. vLLM's registries are per process and refuse
duplicates, so `register_pluggable_layers()` runs once per process (the worker calls it before building the model).
"""

from __future__ import annotations

_registered = False


def register_pluggable_layers() -> bool:
    """Register our layers with vLLM; returns False when they were already registered in this process."""
    global _registered
    if _registered:
        return False
    from vllm.model_executor.custom_op import CustomOp, PluggableLayer

    from ascend_platform.moe.method import AscendMoEMethod
    from ascend_platform.moe.routed_experts import AscendRoutedExperts
    from ascend_platform.ops.logits_processor import AscendLogitsProcessor

    PluggableLayer.register_oot(AscendRoutedExperts, name="RoutedExperts")
    CustomOp.register_oot(AscendMoEMethod, name="UnquantizedFusedMoEMethod")
    PluggableLayer.register_oot(AscendLogitsProcessor, name="LogitsProcessor")
    _registered = True
    return True
