"""The Ascend gated delta-net layer: vLLM's `QwenGatedDeltaNetAttention` with its core (conv + gated delta rule) on
the kernel facade.

The projections, the q/k/v/z/b/a unpacking (Qwen3-Next's interleaved layout or Qwen3.5's flat one), the gated RMS
norm and the output projection stay vLLM's. The core runs as one opaque custom op (`torch.ops.vllm.
ascend_gdn_attention_core`, as vLLM's CPU and CUDA cores do) so a compiled model calls it rather than tracing it.
It reads the layer's conv and recurrent states from `layer.kv_cache`, which vLLM binds from our allocator's pages of
the Mamba-state cache group, and follows vLLM's GDN metadata: decodes first (one token each), then prefills.
Speculative decoding's multi-slot states are refused at start-up by name (`check_supported`).

No `from __future__ import annotations` here: torch infers the custom op's schema from real annotations.
"""

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.utils.torch_utils import LayerNameType, _encode_layer_name, _resolve_layer_name, direct_register_custom_op

from ascend_platform import usage
from ascend_platform.facade import kernel_ops


class AscendQwenGatedDeltaNetAttention(QwenGatedDeltaNetAttention):
    """vLLM's GDN layer whose forward runs its core through `ascend_kernels` on every device kind."""

    def __init__(self, config, vllm_config, prefix: str = "", gqa_interleaved_layout=False,
                 reduce_results: bool = True) -> None:
        check_supported(vllm_config)
        super().__init__(config, vllm_config, prefix, gqa_interleaved_layout=gqa_interleaved_layout,
                         reduce_results=reduce_results)
        self._forward_method = self.forward_ascend
        usage.count("gdn.layers")

    def forward_ascend(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        num_tokens = hidden_states.size(0)
        mixed_qkv, z, b, a = self.prepare_gdn_attention_core_inputs(mixed_qkvz, ba, num_tokens)
        core_attn_out = torch.zeros((num_tokens, self.num_v_heads // self.tp_size, self.head_v_dim),
                                    dtype=hidden_states.dtype, device=hidden_states.device)
        torch.ops.vllm.ascend_gdn_attention_core(mixed_qkv, b, a, core_attn_out, _encode_layer_name(self.prefix))
        return self._output_projection(core_attn_out, z)


def check_supported(vllm_config) -> None:
    """Refuse what the Ascend GDN core does not serve, naming it: speculative decoding keeps one recurrent state per
    draft position (vLLM's spec path), which the facade's ops do not take yet."""
    if vllm_config.speculative_config is not None:
        raise NotImplementedError("Ascend gated delta-net layers do not serve speculative decoding yet (its "
                                  "multi-slot recurrent states); serve the hybrid model without a speculative_config")


def _states(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv states `[slots, dim, width - 1]`, recurrent states `[slots, hv, dv, dk]`) from the layer's bound pages."""
    conv, ssm = layer.kv_cache[0], layer.kv_cache[1]
    return (conv if is_conv_state_dim_first() else conv.transpose(-1, -2)), ssm


def _qkv(layer, mixed_qkv: torch.Tensor):
    q, k, v = layer.rearrange_mixed_qkv(mixed_qkv)  # each [1, tokens, heads, dim]
    return q[0], k[0], v[0]


def ascend_gdn_attention_core(mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                              core_attn_out: torch.Tensor, layer_name: LayerNameType) -> None:
    """Conv + gated delta rule of one GDN layer for this step's tokens, into `core_attn_out`."""
    context = get_forward_context()
    layer = context.no_compile_layers[_resolve_layer_name(layer_name)]
    metadata = context.attn_metadata
    if not isinstance(metadata, dict) or metadata.get(layer.prefix) is None:
        return  # a profiling or dummy run: no states are bound to tokens
    meta = metadata[layer.prefix]
    if meta.num_actual_tokens == 0:
        return
    if meta.spec_sequence_masks is not None or meta.num_accepted_tokens is not None:
        raise NotImplementedError(f"{layer.prefix}: speculative GDN steps are not served by the Ascend GDN core")
    ops = kernel_ops()
    conv_states, ssm_states = _states(layer)
    weight = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    bias = layer.conv1d.bias
    scale = layer.head_k_dim ** -0.5
    slots = meta.non_spec_state_indices_tensor
    starts = meta.non_spec_query_start_loc
    decodes, decode_tokens = meta.num_decodes, meta.num_decode_tokens
    if decodes > 0:
        x = ops.causal_conv1d_update(mixed_qkv[:decode_tokens], weight, bias, conv_states, slots[:decodes],
                                     layer.activation)
        q, k, v = _qkv(layer, x)
        g, beta = ops.gdn_gating(layer.A_log, a[:decode_tokens], b[:decode_tokens], layer.dt_bias)
        core_attn_out[:decode_tokens] = ops.recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states,
                                                                       slots[:decodes], scale)
        usage.count("gdn.decode_tokens", decode_tokens)
    if meta.num_prefills > 0:
        end = decode_tokens + meta.num_prefill_tokens
        seqs = slice(decodes, decodes + meta.num_prefills)
        prefill_starts = starts[decodes:decodes + meta.num_prefills + 1] - decode_tokens
        initial = meta.has_initial_state[seqs]
        x = ops.causal_conv1d_prefill(mixed_qkv[decode_tokens:end], weight, bias, conv_states, prefill_starts,
                                      slots[seqs], initial, layer.activation)
        q, k, v = _qkv(layer, x)
        g, beta = ops.gdn_gating(layer.A_log, a[decode_tokens:end], b[decode_tokens:end], layer.dt_bias)
        core_attn_out[decode_tokens:end] = ops.chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, prefill_starts,
                                                                      slots[seqs], initial, scale)
        usage.count("gdn.prefill_tokens", meta.num_prefill_tokens)
        usage.count_on_device("gdn.prefill_resumed", initial)


direct_register_custom_op(
    op_name="ascend_gdn_attention_core",
    op_func=ascend_gdn_attention_core,
    mutates_args=["core_attn_out"],
)
