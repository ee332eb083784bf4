"""Expert-parallel load balancing (EPLB) of one model: load windows, the rebalance step, its history.

Each routed-experts layer with a placement (`ascend_platform.moe.routed_experts`) counts, in every real forward
pass, the tokens each physical expert slot took (dummy and profile runs are not counted). Every `interval` steps,
at the first MoE layer of a step, before any expert of that step runs, or when `rebalance()` is called between
steps, every expert-parallel rank: sums the layer's window over the EP group (so all ranks decide alike), computes a
new placement (`eplb_policy`), moves the expert weights that change rank (`eplb_transfer`), swaps the layer's
logical->physical map, and opens a new window. A step therefore runs wholly on one placement.

vLLM's own EPLB (`--enable-eplb`) is refused on non-CUDA platforms and its map-and-record kernel is a no-op there,
so the plugin keeps its own; the options are `eplb`, `eplb_redundant_experts`, `eplb_interval` in additional_config.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from vllm.logger import init_logger

from ascend_platform import usage
from ascend_platform.moe.eplb_policy import rebalance as rebalance_policy
from ascend_platform.moe.eplb_transfer import move_expert_weights, plan_moves
from ascend_platform.moe.placement import ExpertPlacement, imbalance

logger = init_logger(__name__)

_CURRENT: EplbController | None = None


class EplbController:
    def __init__(self, *, interval: int, num_redundant: int, owner: Any) -> None:
        self.interval = interval
        self.num_redundant = num_redundant
        self._owner = weakref.ref(owner)  # the VllmConfig of the model being built
        self.layers: list[Any] = []
        self.steps = 0
        self.steps_since = 0
        self.history: list[dict[str, Any]] = []

    def owns(self, owner: Any) -> bool:
        return self._owner() is owner

    def register(self, layer: Any) -> None:
        self.layers.append(layer)

    def on_forward(self, layer: Any, recording: bool) -> None:
        """Called by every placed layer before its experts run; steps are counted at the first layer."""
        if not recording or not self.layers or layer is not self.layers[0]:
            return
        if self.interval and self.steps_since >= self.interval:
            self.rebalance(reason="interval")
        self.steps += 1
        self.steps_since += 1

    # ---- the rebalance step -------------------------------------------------------------------------------------
    def rebalance(self, reason: str = "request") -> dict[str, Any]:
        from vllm.distributed.parallel_state import get_ep_group

        group = get_ep_group()
        record: dict[str, Any] = {"step": self.steps, "reason": reason, "layers": []}
        for layer in self.layers:
            placement: ExpertPlacement = layer.ascend_placement
            load = layer.ascend_load.clone()
            dist.all_reduce(load, group=group.device_group)
            before = imbalance(placement.rank_load(load))
            logical = placement.logical_load(load)
            new_map = rebalance_policy(logical.tolist(), ep_size=placement.ep_size,
                                       slots_per_rank=placement.slots_per_rank, previous=placement.phys2log)
            plan = plan_moves(placement.phys2log, new_map, ep_rank=placement.ep_rank, ep_size=placement.ep_size)
            moved = move_expert_weights(layer.ascend_expert_weights(), plan, group=group.device_group,
                                        global_ranks=group.ranks)
            new = ExpertPlacement(new_map, num_logical=placement.num_logical, ep_size=placement.ep_size,
                                  ep_rank=placement.ep_rank).to(load.device)
            layer.ascend_placement = new
            layer.ascend_load.zero_()
            record["layers"].append({"layer": layer.layer_name, "imbalance_before": before,
                                     "imbalance_predicted": _predicted(new, logical), "received": moved,
                                     "phys2log": new_map})
        record["imbalance_before"] = max((x["imbalance_before"] for x in record["layers"]), default=1.0)
        record["imbalance_predicted"] = max((x["imbalance_predicted"] for x in record["layers"]), default=1.0)
        self.history.append(record)
        self.steps_since = 0
        usage.count("eplb.rebalances")
        usage.count("eplb.experts_received", sum(x["received"] for x in record["layers"]))
        logger.info("EPLB rebalance at step %d (%s): worst per-rank imbalance %.3f -> %.3f predicted",
                    self.steps, reason, record["imbalance_before"], record["imbalance_predicted"])
        return record

    # ---- what tests and benchmarks read -------------------------------------------------------------------------
    def window(self) -> dict[str, Any]:
        """The load recorded since the last rebalance (or reset), per layer and per rank, and its imbalance."""
        layers = []
        for layer in self.layers:
            placement = layer.ascend_placement
            rank_load = placement.rank_load(layer.ascend_load)
            layers.append({"layer": layer.layer_name, "physical_load": layer.ascend_load.tolist(),
                           "rank_load": rank_load.tolist(), "imbalance": imbalance(rank_load),
                           "phys2log": list(placement.phys2log)})
        return {"steps": self.steps, "layers": layers,
                "imbalance": max((x["imbalance"] for x in layers), default=1.0)}

    def reset_window(self) -> None:
        for layer in self.layers:
            layer.ascend_load.zero_()

    def state(self) -> dict[str, Any]:
        return {"interval": self.interval, "redundant": self.num_redundant, "layers": len(self.layers),
                "steps": self.steps, "rebalances": [{k: v for k, v in h.items() if k != "layers"}
                                                     for h in self.history]}


def _predicted(placement: ExpertPlacement, logical_load: torch.Tensor) -> float:
    """The per-rank imbalance `placement` gives if each expert's load splits evenly over its replicas."""
    share = logical_load.double() / placement.replica_count.to(logical_load.device).double()
    per_slot = share[torch.tensor(placement.phys2log, device=logical_load.device)]
    return imbalance(placement.rank_load(per_slot))


def controller_for(vllm_config: Any, *, interval: int, num_redundant: int) -> EplbController:
    """The controller of the model `vllm_config` builds (a new engine in the same process gets a new one)."""
    global _CURRENT
    if _CURRENT is None or not _CURRENT.owns(vllm_config):
        _CURRENT = EplbController(interval=interval, num_redundant=num_redundant, owner=vllm_config)
    return _CURRENT


def current_controller() -> EplbController | None:
    """The controller of the last model built in this process with EPLB on (None without EPLB)."""
    return _CURRENT
