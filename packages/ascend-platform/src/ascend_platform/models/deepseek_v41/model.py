"""`AscendDeepseekV41ForCausalLM`: DeepSeek V4.1's text model on Ascend.

vLLM's V4.1 (`vllm/models/deepseek_v41/nvidia/model.py`) is CUDA-only end to end (TileLang mHC, Triton engram,
CUDA streams at construction), so the decoder is rebuilt here from its parts, in its order and with its parameter
names: delayed mHC around each sublayer (`hyper_connections`), the engram between the previous layer's mHC post and
this layer's pre (`engram`), Ascend's V4.1 attention (`attention.AscendDeepseekV41Attention`), and V4's MoE as vLLM's
device-neutral (CPU) V4 implementation builds it, which our platform routes through `ascend_kernels` — with V4.1's
rule of no hash-routed layers. Weights load through vLLM's V4.1 loader and weights mapper.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.fused_moe import fused_moe_make_expert_params_mapping
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.utils import AutoWeightsLoader, extract_layer_index, make_layers, maybe_prefix
from vllm.models.deepseek_v4.cpu.model import DeepseekV4MoE
from vllm.models.deepseek_v41.common.engram import EngramLayout
from vllm.models.deepseek_v41.nvidia.model import DeepseekV4Model as _VllmV41Model
from vllm.models.deepseek_v41.nvidia.model import _make_deepseek_v4_weights_mapper

from ascend_platform import usage
from ascend_platform.models.deepseek_v41.attention import AscendDeepseekV41Attention
from ascend_platform.models.deepseek_v41.engram import AscendEngram, AscendNgramHash, HashHistory
from ascend_platform.models.deepseek_v41.hyper_connections import hc_collapse, mhc_post, mhc_pre_delayed

# V4.1's post-mix multiplier is fixed (nvidia/model.py DeepseekV4DecoderLayer.hc_post_alpha).
HC_POST_ALPHA = 2.0


@contextmanager
def _no_hash_routed_layers(config: Any) -> Iterator[None]:
    """V4's MoE routes its first `num_hash_layers` layers by token id; V4.1 has none (vLLM's V4.1 MoE passes
    num_hash_layers=0 whatever the config says), so V4's MoE is built with the field at 0."""
    had, old = hasattr(config, "num_hash_layers"), getattr(config, "num_hash_layers", None)
    config.num_hash_layers = 0
    try:
        yield
    finally:
        if had:
            config.num_hash_layers = old
        else:
            del config.num_hash_layers


def _mix_params(hc_mult: int, hidden_size: int) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
    mix = (2 + hc_mult) * hc_mult
    return (nn.Parameter(torch.empty(mix, hc_mult * hidden_size, dtype=torch.float32), requires_grad=False),
            nn.Parameter(torch.empty(mix, dtype=torch.float32), requires_grad=False),
            nn.Parameter(torch.empty(3, dtype=torch.float32), requires_grad=False))


class AscendDeepseekV41DecoderLayer(nn.Module):
    def __init__(self, vllm_config: Any, prefix: str, topk_indices_buffer: torch.Tensor,
                 candidate_block_buffer: torch.Tensor | None, engram_layout: EngramLayout | None) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.layer_id = extract_layer_index(prefix)
        self.hidden_size, self.hc_mult = config.hidden_size, config.hc_mult
        self.rms_norm_eps, self.hc_eps = config.rms_norm_eps, config.hc_eps
        self.hc_sinkhorn_iters = config.hc_sinkhorn_iters
        self.engram: AscendEngram | None = None
        if engram_layout is not None and self.layer_id in engram_layout.layer_ids:
            # Built at layer 0 too (its weights are in the checkpoint) but never run there, as in vLLM: the first
            # layer has no previous mHC post to inject into.
            self.engram = AscendEngram(config, engram_layout, engram_layout.layer_ids.index(self.layer_id),
                                       vllm_config.quant_config, prefix=f"{prefix}.engram")
        self.attn = AscendDeepseekV41Attention(vllm_config, prefix=f"{prefix}.attn",
                                               topk_indices_buffer=topk_indices_buffer, aux_stream_list=None,
                                               candidate_block_buffer=candidate_block_buffer)
        with _no_hash_routed_layers(config):
            self.ffn = DeepseekV4MoE(vllm_config, prefix=f"{prefix}.ffn")
        self.attn_norm = RMSNorm(self.hidden_size, self.rms_norm_eps)
        self.ffn_norm = RMSNorm(self.hidden_size, self.rms_norm_eps)
        self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale = _mix_params(self.hc_mult, self.hidden_size)
        self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale = _mix_params(self.hc_mult, self.hidden_size)
        # The first layer mixes the broadcast embedding: its projection is hc_attn_fn summed over the copy blocks
        # (set after loading).
        self.hc_attn_fn_broadcast: torch.Tensor | None = None

    def _pre(self, residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
             pre_mix: torch.Tensor | None, x: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return mhc_pre_delayed(residual, fn, scale, base, self.rms_norm_eps, self.hc_eps, HC_POST_ALPHA,
                               self.hc_sinkhorn_iters, pre_mix, x)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, input_ids: torch.Tensor | None,
                pre_mix: torch.Tensor | None, post_mix: torch.Tensor | None, res_mix: torch.Tensor | None,
                residual: torch.Tensor | None, engram_hashes: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: the embedding [T, H] at the first layer, else the previous layer's FFN output. Returns this layer's
        FFN output, the streams before its post, its post/comb mixes and its FFN pre-mix (the next collapse's)."""
        if residual is None:
            # First layer: the streams are the embedding's copies; the identity pre-mix selects copy 0, i.e. the
            # raw embedding is the attention input.
            assert self.hc_attn_fn_broadcast is not None, "process_weights_after_loading did not run"
            residual = x.unsqueeze(1).expand(-1, self.hc_mult, -1).contiguous()
            post_mix, res_mix, layer_input, attn_pre = self._pre(residual, self.hc_attn_fn_broadcast,
                                                                 self.hc_attn_scale, self.hc_attn_base, None, x=x)
            usage.count("dsv41.first_layer_broadcast_pre")
        else:
            assert post_mix is not None and res_mix is not None and pre_mix is not None
            residual = mhc_post(x, residual, post_mix, res_mix)
            if self.engram is not None and engram_hashes is not None:
                residual = self.engram(residual, engram_hashes[:, self.engram.layer_hash_index])
            post_mix, res_mix, layer_input, attn_pre = self._pre(residual, self.hc_attn_fn, self.hc_attn_scale,
                                                                 self.hc_attn_base, pre_mix)
        x = self.attn(positions, self.attn_norm(layer_input))
        residual = mhc_post(x, residual, post_mix, res_mix)
        post_mix, res_mix, layer_input, ffn_pre = self._pre(residual, self.hc_ffn_fn, self.hc_ffn_scale,
                                                            self.hc_ffn_base, attn_pre)
        x = self.ffn(self.ffn_norm(layer_input), input_ids)
        return x, residual, post_mix, res_mix, ffn_pre

    def finalize_broadcast_weights(self) -> None:
        self.hc_attn_fn_broadcast = self.hc_attn_fn.detach().view(-1, self.hc_mult, self.hidden_size).sum(dim=1)


def _step_metadata() -> dict | None:
    """This step's attention metadata by layer name; None outside a real step (profile/dummy runs bind none)."""
    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    return metadata if isinstance(metadata, dict) else None


class AscendDeepseekV41Model(nn.Module):
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config, self.quant_config = config, vllm_config.quant_config
        self.hc_mult = config.hc_mult
        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.topk_indices_buffer = torch.empty(max_tokens, config.index_topk, dtype=torch.int32)
        self.candidate_block_buffer: torch.Tensor | None = None
        if getattr(config, "candidate_source_layer_id", -1) >= 0 and getattr(config, "candidate_topk_blocks", 0) > 0:
            self.candidate_block_buffer = torch.empty(max_tokens, config.candidate_topk_blocks, dtype=torch.int32)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                   quant_config=self.quant_config, prefix=f"{prefix}.embed_tokens")
        self.engram_layout = EngramLayout.from_config(config)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: AscendDeepseekV41DecoderLayer(vllm_config, prefix, self.topk_indices_buffer,
                                                         self.candidate_block_buffer, self.engram_layout),
            prefix=f"{prefix}.layers")
        self.engram_hash: AscendNgramHash | None = None
        self.engram_history: HashHistory | None = None
        if self.engram_layout is not None and any(i > 0 for i in self.engram_layout.layer_ids):
            self.engram_hash = AscendNgramHash(vllm_config, self.engram_layout)
            if not vllm_config.use_v2_model_runner:
                first = self.layers[self.start_layer]
                self.engram_history = HashHistory(first.attn.swa_cache_layer)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def _engram_hashes(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       lookback_token_ids: torch.Tensor | None) -> torch.Tensor | None:
        if self.engram_hash is None:
            return None
        metadata = _step_metadata()
        if metadata is None:  # profile / dummy run: no batch to hash
            return None
        # Any layer's metadata describes the batch; the first layer's sliding-window one also addresses its cache.
        swa_metadata = metadata[self.layers[self.start_layer].attn.swa_cache_layer.prefix]
        query_start_loc = swa_metadata.query_start_loc
        num_reqs = query_start_loc.shape[0] - 1
        usage.count("dsv41.engram_hash_calls")
        if lookback_token_ids is not None:
            return self.engram_hash(input_ids, positions, query_start_loc, lookback_token_ids[:num_reqs])
        if self.engram_history is None:
            raise NotImplementedError("DeepSeek V4.1's engram needs `lookback_token_ids` from model runner V2")
        self.engram_history.record(input_ids, self.engram_hash.token_map, swa_metadata)
        return self.engram_hash(input_ids, positions, query_start_loc, None, self.engram_history,
                                swa_metadata.block_table[:num_reqs])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None,
                lookback_token_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        engram_hashes = self._engram_hashes(input_ids, positions, lookback_token_ids)
        residual = post_mix = res_mix = pre_mix = None
        for layer in self.layers[self.start_layer:self.end_layer]:
            hidden_states, residual, post_mix, res_mix, pre_mix = layer(
                hidden_states, positions, input_ids, pre_mix, post_mix, res_mix, residual, engram_hashes)
        assert residual is not None and post_mix is not None and res_mix is not None and pre_mix is not None
        # No successor folds the last FFN's post in; the streams are then collapsed with that FFN's pre-mix (V4.1
        # has no learned head for it).
        residual = mhc_post(hidden_states, residual, post_mix, res_mix)
        return self.norm(hc_collapse(residual, pre_mix))

    def get_expert_mapping(self) -> list[tuple[str, str, int, str]]:
        return fused_moe_make_expert_params_mapping(self, ckpt_gate_proj_name="w1", ckpt_down_proj_name="w2",
                                                    ckpt_up_proj_name="w3", num_experts=self.config.n_routed_experts)

    # vLLM's V4.1 loader (stacked wq_a/wkv, compressor wkv/wgate and w1/w3 shards, experts, attention sinks); it
    # reads only names this class shares with vLLM's V4.1 model.
    use_sequence_parallel = False
    load_weights = _VllmV41Model.load_weights

    def finalize_broadcast_weights(self) -> None:
        first = self.layers[self.start_layer]
        if isinstance(first, AscendDeepseekV41DecoderLayer):
            first.finalize_broadcast_weights()


class AscendDeepseekV41ForCausalLM(nn.Module):
    packed_modules_mapping = {"gate_up_proj": ["w1", "w3"], "fused_wqa_wkv": ["wq_a", "wkv"],
                              "fused_wkv_wgate": ["wkv", "wgate"]}

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        # DeepSeek's release names (`layers.`, `embed.`, `head.`, `.scale`, `ffn.gate.bias`, engram tables), as
        # vLLM's V4.1 text model maps them.
        self.hf_to_vllm_mapper = _make_deepseek_v4_weights_mapper(getattr(config, "expert_dtype", "fp4"))
        self.model = AscendDeepseekV41Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)
        usage.note("model_class", f"{type(self).__module__}.{type(self).__qualname__}")

    @property
    def token_lookback_depth(self) -> int:
        """Tokens before a chunk the engram hash reads; the runner passes them as `lookback_token_ids`."""
        engram_hash = self.model.engram_hash
        return engram_hash.lookback_depth if engram_hash is not None else 0

    @staticmethod
    def get_model_state_cls() -> type:
        from ascend_platform.models.deepseek_v41.model_state import AscendDeepseekV41ModelState

        return AscendDeepseekV41ModelState

    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings: Any = None, **_: Any) -> torch.Tensor:
        # vLLM registers V4.1's architecture as its vision-language model, so the engine treats it as multimodal and
        # hands the (always empty: no vision tower here, start-up refuses one) image embeddings along.
        if multimodal_embeddings is not None and len(multimodal_embeddings) > 0:
            raise NotImplementedError("DeepSeek V4.1 on Ascend serves the text model only: got image embeddings")
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None,
                lookback_token_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds,
                          lookback_token_ids=lookback_token_ids)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
        self.model.finalize_broadcast_weights()
        return loaded

    def get_expert_mapping(self) -> list[tuple[str, str, int, str]]:
        return self.model.get_expert_mapping()
