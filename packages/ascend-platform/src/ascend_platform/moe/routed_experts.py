"""The Ascend routed-experts layer, and its composition with a model's own `RoutedExperts` subclass.

vLLM builds a MoE layer's experts as a `RoutedExperts` (a `PluggableLayer`): a plain one through the out-of-tree
registry, where `AscendRoutedExperts` is registered under the name "RoutedExperts"; a model may bring its own
subclass (gpt-oss, dbrx, upstream 52209: custom expert weight loading), which `PluggableLayer` instantiates as it
is, since it looks up only the exact class name. Both end up Ascend layers through their MoE method: the method is
the one object vLLM builds for every routed-experts layer (`AscendMoEMethod`, registered out of tree for
`UnquantizedFusedMoEMethod`), and its `create_weights` is where it first sees the layer. There a layer that is not
yet Ascend gets the composition `(AscendRoutedExpertsMixin, <its class>)` as its class: the subclass's weight
loader, attributes and methods stay; the mixin adds only our forward (routing through `ascend_kernels`, EPLB) and
placement state. A subclass that overrides the forward entry points itself is refused with its name, never
silently replaced.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

from ascend_platform import usage
from ascend_platform.moe.eplb import EplbController, controller_for
from ascend_platform.moe.placement import ExpertPlacement
from ascend_platform.moe.routing import check_routing, route

logger = init_logger(__name__)

# What the mixin defines for the layer's forward; a model's subclass overriding one of these cannot be composed.
_FORWARD_ENTRIES = ("forward_monolithic", "forward_modular")


class AscendRoutedExpertsMixin:
    """Routing through `ascend_kernels`, expert parallelism and EPLB for a routed-experts layer."""

    ascend_placement: ExpertPlacement | None = None
    ascend_load: torch.Tensor | None = None
    _ascend_eplb: EplbController | None = None

    def _get_quant_method(self, prefix: str, quant_config: Any, moe_config: Any) -> Any:
        # Runs in RoutedExperts.__init__ of the plain layer (a model's subclass is composed later, by the method).
        # The quantization config picks the method: the platform's quantized experts, or none for float experts
        # (vLLM's unquantized method, registered out of tree as AscendMoEMethod); anything else is refused by name.
        from ascend_platform.moe.method import AscendMoEMethod
        from ascend_platform.quantization.moe_schemes import AscendQuantMoEMethod

        method = super()._get_quant_method(prefix, quant_config, moe_config)
        if not isinstance(method, (AscendMoEMethod, AscendQuantMoEMethod)):
            raise NotImplementedError(f"{prefix}: the Ascend routed experts do not run {type(method).__name__} "
                                      f"({quant_config.get_name()!r} experts)")
        return method

    def ascend_setup(self) -> None:
        """Check what we can run and read the EPLB options; called once, when the layer's weights are created."""
        check_routing(self)
        from ascend_platform.npu_platform import ascend_config_of

        vllm_config = get_current_vllm_config()
        ascend = ascend_config_of(vllm_config)
        self._ascend_eplb_options = (ascend.eplb, ascend.eplb_redundant_experts, ascend.eplb_interval)
        if ascend.eplb:
            self._ascend_eplb = controller_for(vllm_config, interval=ascend.eplb_interval,
                                               num_redundant=ascend.eplb_redundant_experts)
        usage.count("moe.layers")
        usage.note("moe.layer_class", " <- ".join(c.__qualname__ for c in type(self).__mro__[:3]))

    def ascend_after_loading(self) -> None:
        """After the checkpoint is loaded (the model's own loader has run): lay out the physical expert slots."""
        if self._ascend_eplb is None:
            return
        parallel = self.moe_config.moe_parallel_config
        if not parallel.use_ep or parallel.ep_size < 2:
            raise ValueError(f"{self.layer_name}: 'eplb' needs expert parallelism over at least two ranks "
                             f"(enable_expert_parallel with tensor_parallel_size >= 2); got ep_size={parallel.ep_size}")
        if self.expert_placement_strategy != "linear":
            raise ValueError(f"{self.layer_name}: 'eplb' starts from vLLM's linear expert placement, not "
                             f"expert_placement_strategy={self.expert_placement_strategy!r}")
        placement = ExpertPlacement.initial(num_logical=self.global_num_experts,
                                            num_redundant=self._ascend_eplb.num_redundant,
                                            ep_size=parallel.ep_size, ep_rank=parallel.ep_rank)
        own = placement.local_slice()
        loaded_first = placement.ep_rank * (self.global_num_experts // parallel.ep_size)
        rows = torch.tensor([e - loaded_first for e in own], device=self.w13_weight.device)
        for name in self._ascend_expert_param_names():
            param = getattr(self, name)
            # Redundant slots start as copies of this rank's own experts; the checkpoint filled the first rows.
            param.data = param.data.index_select(0, rows).contiguous()
        self.ascend_placement = placement.to(self.w13_weight.device)
        self.ascend_load = torch.zeros(placement.num_physical, dtype=torch.int64, device=self.w13_weight.device)
        self._ascend_eplb.register(self)
        usage.count("eplb.layers")

    def _ascend_expert_param_names(self) -> list[str]:
        return [n for n in ("w13_weight", "w2_weight", "w13_bias", "w2_bias") if getattr(self, n, None) is not None]

    def ascend_expert_weights(self) -> list[torch.Tensor]:
        """The per-expert tensors EPLB moves (first dim = local physical slots)."""
        return [getattr(self, n).data for n in self._ascend_expert_param_names()]

    def _ascend_local_ids(self, ids: torch.Tensor, recording: bool) -> torch.Tensor:
        """The weight row of each (token, slot) pair on this rank, -1 where another rank holds the expert."""
        if self.ascend_placement is not None:
            physical = self.ascend_placement.physical_ids(ids)
            if recording:
                self.ascend_load += torch.bincount(physical.reshape(-1), minlength=self.ascend_load.shape[0])
            return self.ascend_placement.local_rows(physical)
        if self.use_ep and self.expert_map is not None:
            if recording:
                usage.count("moe.expert_map")
            return self.expert_map[ids.long()]  # vLLM's global -> local map, -1 for experts on other ranks
        return ids

    def forward_monolithic(self, x: torch.Tensor, router_logits: torch.Tensor | None = None,
                           input_ids: torch.Tensor | None = None) -> torch.Tensor:
        recording = _real_forward()
        if self._ascend_eplb is not None:
            self._ascend_eplb.on_forward(self, recording)
        weights, ids = route(self, x, router_logits)
        if self.apply_router_weight_on_input:
            if weights.shape[1] != 1:
                raise NotImplementedError(f"{self.layer_name}: router weights on the input need top_k == 1")
            x = x * weights.to(x.dtype)
            weights = torch.ones_like(weights)
        usage.count("moe.forward")
        return self.quant_method.apply_experts(self, x, weights, self._ascend_local_ids(ids, recording))


def _real_forward() -> bool:
    """False in dummy and profile runs (no attention metadata), whose tokens are not a load to balance."""
    return is_forward_context_available() and bool(get_forward_context().attn_metadata)


@functools.cache
def ascend_composition(cls: type) -> type:
    """`(AscendRoutedExpertsMixin, cls)`: cls's loader and behaviour, our forward and EPLB (cached per class)."""
    if issubclass(cls, AscendRoutedExpertsMixin):
        return cls
    if not issubclass(cls, RoutedExperts):
        raise TypeError(f"{cls.__qualname__} is not a vLLM RoutedExperts")
    for entry in _FORWARD_ENTRIES:
        if getattr(cls, entry) is not getattr(RoutedExperts, entry):
            raise NotImplementedError(f"{cls.__module__}.{cls.__qualname__} overrides {entry}; the Ascend routed "
                                      f"experts cannot be composed with it")
    return type(f"Ascend{cls.__name__}", (AscendRoutedExpertsMixin, cls),
                {"__module__": __name__, "__qualname__": f"Ascend{cls.__qualname__}"})


def adopt(layer: Any) -> None:
    """Make `layer` (a RoutedExperts being built) an Ascend layer: compose its class if needed, then set it up."""
    cls = type(layer)
    if not isinstance(layer, AscendRoutedExpertsMixin):
        layer.__class__ = ascend_composition(cls)
        usage.count("moe.composed_subclasses")
        logger.info("Ascend routed experts composed with the model's %s.%s", cls.__module__, cls.__qualname__)
    layer.ascend_setup()


AscendRoutedExperts = ascend_composition(RoutedExperts)
AscendRoutedExperts.__doc__ = "vLLM's RoutedExperts with Ascend routing, expert parallelism and EPLB."
