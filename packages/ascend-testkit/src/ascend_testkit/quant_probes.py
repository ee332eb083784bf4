"""What the quantization tests read inside an engine host: the loaded linears' weight bytes per method."""

from __future__ import annotations

from typing import Any


def _model(worker: Any) -> Any:
    runner = worker.model_runner
    return getattr(runner, "model", None) or runner.get_model()


def linear_weights(worker: Any) -> dict[str, Any]:
    """Per linear kind (its method's class), parameter count and bytes of the loaded `weight` tensors, and the
    dtypes seen: what the model keeps in memory after `process_weights_after_loading`."""
    from vllm.model_executor.layers.linear import LinearBase

    kinds: dict[str, dict[str, Any]] = {}
    for _name, module in _model(worker).named_modules():
        if not isinstance(module, LinearBase):
            continue
        weight = module.weight
        entry = kinds.setdefault(type(module.quant_method).__name__, {"params": 0, "bytes": 0, "dtypes": []})
        entry["params"] += weight.numel()
        entry["bytes"] += weight.numel() * weight.element_size()
        if str(weight.dtype) not in entry["dtypes"]:
            entry["dtypes"].append(str(weight.dtype))
    return kinds


def expert_weights(worker: Any) -> dict[str, Any]:
    """Per routed-experts method (its class), the experts' logical parameter count (E x (2I x H + H x I)), the
    bytes of the loaded `w13_weight` / `w2_weight` tensors and their dtypes: int4 experts keep two values per byte."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    kinds: dict[str, dict[str, Any]] = {}
    for _name, module in _model(worker).named_modules():
        if not isinstance(module, RoutedExperts):
            continue
        entry = kinds.setdefault(type(module.quant_method).__name__, {"params": 0, "bytes": 0, "dtypes": []})
        inter, hidden = module.intermediate_size_per_partition, module.hidden_size
        entry["params"] += module.local_num_experts * 3 * inter * hidden
        for weight in (module.w13_weight, module.w2_weight):
            entry["bytes"] += weight.numel() * weight.element_size()
            if str(weight.dtype) not in entry["dtypes"]:
                entry["dtypes"].append(str(weight.dtype))
    return kinds
