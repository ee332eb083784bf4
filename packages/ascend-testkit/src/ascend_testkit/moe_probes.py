"""What the engine harness runs inside a MoE engine's workers (`EngineHost.rpc("ascend_testkit.moe_probes:...")`).

They read and drive the platform's MoE parts through their public surface: the EPLB controller of the model
(`ascend_platform.moe.eplb.current_controller`) and the model's routed-experts layers.
"""

from __future__ import annotations

from typing import Any


def _controller() -> Any:
    from ascend_platform.moe.eplb import current_controller

    controller = current_controller()
    if controller is None:
        raise RuntimeError("this engine runs without EPLB (additional_config eplb=True)")
    return controller


def eplb_window(worker: Any) -> dict[str, Any]:
    """Per layer and rank, the expert load recorded since the last rebalance or reset, and its imbalance."""
    return _controller().window()


def eplb_state(worker: Any) -> dict[str, Any]:
    return _controller().state()


def eplb_reset(worker: Any) -> None:
    _controller().reset_window()


def eplb_rebalance(worker: Any) -> dict[str, Any]:
    """Rebalance now (between engine steps), as the interval trigger does inside a step."""
    record = _controller().rebalance(reason="probe")
    return {k: v for k, v in record.items() if k != "layers"} | {
        "received": [x["received"] for x in record["layers"]], "phys2log": [x["phys2log"] for x in record["layers"]]}


def routed_experts(worker: Any) -> list[dict[str, Any]]:
    """Each routed-experts layer: its class's MRO names, the name of the model's custom routing function (None when
    the layer routes by its `scoring_func`), and per local expert the down projection's norm and the loaded
    per-expert scale when the layer has one (`ScaledExperts`)."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    model = worker.model_runner.get_model()
    out = []
    for name, module in model.named_modules():
        if isinstance(module, RoutedExperts):
            scale = getattr(module, "w2_scale", None)
            routing = getattr(module, "custom_routing_function", None)
            out.append({"name": name, "mro": [c.__qualname__ for c in type(module).__mro__[:4]],
                        "custom_routing": None if routing is None else getattr(routing, "__name__", repr(routing)),
                        "w2_norms": module.w2_weight.detach().float().flatten(1).norm(dim=1).tolist(),
                        "w2_scale": None if scale is None else scale.detach().float().tolist()})
    return out



def register_scaled_experts(worker: Any) -> None:
    """Register the scaled-experts test model in this process. A single-rank engine's worker is its host process,
    so engines started later in the same host can load it (`ascend_testkit.models.scaled_experts`)."""
    from ascend_testkit.models.scaled_experts import register

    register()
