"""A test model whose MoE layers bring their own `RoutedExperts` subclass with a loader that does something visible.

`ScaledExperts` (a `RoutedExperts`) multiplies each expert's down projection by a per-expert `scale` read from the
checkpoint (`experts.<e>.down_proj.scale`, which vLLM's expert mapping hands it as `w2_scale`), in whichever order
the two arrive. `ScaledExpertsQwen3MoeForCausalLM` is Qwen3-MoE with that experts class (vLLM's attention, norms,
gate and `FusedMoEFactory(routed_experts_cls=...)`), plus `compute_logits_local` for batch-sharded sampling.
`ascend_testkit.models.moe.cached_scaled_experts_moe` writes its checkpoint: the tiny Qwen3-MoE with every
`down_proj` divided by its scale, so the model equals the tiny Qwen3-MoE exactly when this loader runs.

`register()` adds the architecture to vLLM's model registry of the calling process (an engine host's `--setup`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.fused_moe import FusedMoEFactory
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.qwen3_moe import (
    Qwen3MoeAttention,
    Qwen3MoeDecoderLayer,
    Qwen3MoeForCausalLM,
    Qwen3MoeModel,
)
from vllm.model_executor.models.utils import maybe_prefix
from vllm.model_executor.utils import set_weight_attrs


class ScaledExperts(RoutedExperts):
    """Routed experts whose loader scales expert e's down projection by the checkpoint's `scale[e]`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        scale = nn.Parameter(torch.ones(self.local_num_experts, dtype=torch.float32), requires_grad=False)
        self.register_parameter("w2_scale", scale)
        set_weight_attrs(scale, {"weight_loader": self.weight_loader})
        self._scaled: set[int] = set()
        self._down_loaded: set[int] = set()

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, weight_name: str, shard_id: str,
                      expert_id: int, return_success: bool = False) -> bool | None:
        local = self._map_global_expert_id_to_local_expert_id(expert_id)
        if param is self.w2_scale:
            if local == -1:
                return False if return_success else None
            param.data[local] = loaded_weight.reshape(()).float()
            if local in self._down_loaded:
                self._apply_scale(local)
            return True if return_success else None
        done = super().weight_loader(param, loaded_weight, weight_name, shard_id, expert_id, return_success=True)
        if done and shard_id == "w2" and param is self.w2_weight:
            self._down_loaded.add(local)
            self._apply_scale(local)
        return done if return_success else None

    def _apply_scale(self, local: int) -> None:
        if local in self._scaled or local not in self._down_loaded:
            return
        self.w2_weight.data[local] *= self.w2_scale.data[local].to(self.w2_weight.dtype)
        self._scaled.add(local)

class ScaledExpertsSparseMoeBlock(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_text_config
        self.gate = GateLinear(config.hidden_size, config.num_experts, quant_config=None, prefix=f"{prefix}.gate")
        self.experts = FusedMoEFactory(
            gate=self.gate, num_experts=config.num_experts, top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size, intermediate_size=config.moe_intermediate_size,
            renormalize=config.norm_topk_prob, prefix=f"{prefix}.experts",
            tp_size=get_tensor_model_parallel_world_size(), routed_experts_cls=ScaledExperts)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.experts(hidden_states=hidden_states, router_logits=hidden_states)

class ScaledExpertsDecoderLayer(nn.Module):
    forward = Qwen3MoeDecoderLayer.forward

    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_text_config
        self.self_attn = Qwen3MoeAttention(
            hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, rope_parameters=config.rope_parameters,
            max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
            head_dim=getattr(config, "head_dim", None), cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.self_attn")
        self.mlp = ScaledExpertsSparseMoeBlock(vllm_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

class ScaledExpertsQwen3MoeForCausalLM(Qwen3MoeForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.quant_config = None
        self.model = Qwen3MoeModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"),
                                   decoder_layer_type=ScaledExpertsDecoderLayer)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        self.moe_layers = [layer.mlp.experts for layer in self.model.layers]
        self.num_moe_layers = len(self.moe_layers)

    def compute_logits_local(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states, skip_gather=True)


def register() -> None:
    """Make `ScaledExpertsQwen3MoeForCausalLM` known to vLLM in this process."""
    from vllm import ModelRegistry

    from ascend_testkit.models.moe import SCALED_ARCH

    ModelRegistry.register_model(SCALED_ARCH, f"{__name__}:{SCALED_ARCH}")
