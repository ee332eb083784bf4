"""The Ascend MLA backend (DeepSeek-V2/V3 multi-head latent attention), built on `ascend_kernels`.

vLLM's `MLAAttention` layer orchestrates the step: it writes each new token's latent (`kv_lora_rank` elements) and
rotary key (`qk_rope_head_dim`) into the cache through `do_kv_cache_update`, sends decode tokens to `forward_mqa`
(queries with W_UK absorbed, attention over the latent cache, W_UV applied by the layer) and prefill tokens to
`forward_mha`. The cache is the KV tensor vLLM hands the layer: the backend declares the device layout torch_npu's
MLA kernels take (`kv_cache_planes`), so our allocator lays the layer's region out as a dense latent cache followed by
a dense rope cache (`ascend_core.kv.planes`), which `ascend_core.kv.views.mla_kv_of` cuts; nothing else is stored.

Prefill runs in one pass per step, chunked prefill included: when any prefill request continues a context, each
prefill request's whole latent sequence is gathered from the cache (its new tokens were just written there),
up-projected with `kv_b_proj`, and attended with the bottom-right causal mask of a chunk (`mla_prefill_attention`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MLAAttentionImpl,
    MultipleOf,
)
from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from ascend_platform import usage
from ascend_platform.attention.backend import step_host_lengths
from ascend_platform.facade import kernel_ops

logger = init_logger(__name__)

MLA_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")
MLA_BLOCK_MULTIPLE = 16


def _rope_dim_of_model(default: int) -> int:
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    text = getattr(getattr(config, "model_config", None), "hf_text_config", None)
    return int(getattr(text, "qk_rope_head_dim", None) or default)


class AscendMLABackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = list(MLA_KV_CACHE_DTYPES)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(MLA_BLOCK_MULTIPLE)]

    @staticmethod
    def get_name() -> str:
        return "ASCEND_MLA"

    @staticmethod
    def get_impl_cls() -> type[AscendMLAImpl]:
        return AscendMLAImpl

    @staticmethod
    def get_builder_cls() -> type[AscendMLAMetadataBuilder]:
        return AscendMLAMetadataBuilder

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def kv_cache_planes(cls, spec: Any) -> Any:
        """The device KV layout torch_npu's MLA kernels take: the latent and the rope part as dense planes."""
        from ascend_core.kv.planes import mla_planes
        from ascend_core.kv.views import DEFAULT_MLA_ROPE_DIM

        return mla_planes(spec, getattr(spec, "rope_head_dim", 0) or _rope_dim_of_model(DEFAULT_MLA_ROPE_DIM))

    @classmethod
    def customize_spec(cls, spec: Any) -> Any:
        """The layer's cache as our `AscendMLAAttentionSpec`: same pages, with the rotary width stated."""
        from ascend_core.kv.specs import ascend_mla_spec
        from ascend_core.kv.views import DEFAULT_MLA_ROPE_DIM

        return ascend_mla_spec(spec, rope_head_dim=_rope_dim_of_model(DEFAULT_MLA_ROPE_DIM))


@dataclass
class AscendMLADecodeMetadata:
    block_table: torch.Tensor  # int32 [num_decodes, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_decodes]
    seq_lens_host: list[int] | None = None  # the same on the host, built once per step (None in a captured graph)


@dataclass
class AscendMLAPrefillMetadata:
    block_table: torch.Tensor  # int32 [num_prefills, max_blocks]
    query_start_loc: torch.Tensor  # int32 [num_prefills + 1], from the first prefill token
    seq_lens: torch.Tensor  # int32 [num_prefills]: context including this step's tokens
    kv_start_loc: torch.Tensor  # int32 [num_prefills + 1]: cumulative seq_lens (rows of the gathered context)
    max_query_len: int
    has_context: bool  # some request continues a context already in the cache (chunked prefill, prefix hit)
    # query_start_loc / seq_lens / kv_start_loc on the host, built once per step for every layer's kernels
    query_start_loc_host: list[int] | None = None
    seq_lens_host: list[int] | None = None
    kv_start_loc_host: list[int] | None = None
    chunked_context: None = None  # read by vLLM's MLA layer (fused output quantization); context is ours to handle


@dataclass
class AscendMLAMetadata:
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    decode: AscendMLADecodeMetadata | None = None
    prefill: AscendMLAPrefillMetadata | None = None
    causal: bool = True


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


class AscendMLAMetadataBuilder(AttentionMetadataBuilder[AscendMLAMetadata]):
    # Decodes (query length 1) first, then prefills: vLLM's runner reorders the batch for us.
    reorder_batch_threshold: int = 1

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # vLLM's host copy of seq_lens is exact unless speculative decoding runs ahead of it
        self._host_seq_lens_exact = vllm_config.speculative_config is None

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendMLAMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor) or not m.causal:
            raise NotImplementedError("ASCEND_MLA serves causal decoder attention only")
        qsl_host, seq_host = step_host_lengths(m, seq_lens_exact=self._host_seq_lens_exact)
        nd, npf, nd_tokens, _ = split_decodes_and_prefills(m, decode_threshold=self.reorder_batch_threshold)
        if nd and npf:
            usage.count("attention.ascend_mla.mixed_batches")
        n = m.num_reqs
        block_table = m.block_table_tensor[:n].to(torch.int32)
        seq_lens = m.seq_lens[:n].to(torch.int32)
        decode = AscendMLADecodeMetadata(block_table[:nd], seq_lens[:nd], seq_host[:nd]) if nd else None
        prefill = None
        if npf:
            first = qsl_host[nd]
            prefill_qsl = [q - first for q in qsl_host[nd:n + 1]]
            prefill_seq_host = seq_host[nd:n]
            query_lens = [b - a for a, b in itertools.pairwise(prefill_qsl)]
            prefill_seq = seq_lens[nd:]
            prefill = AscendMLAPrefillMetadata(
                block_table=block_table[nd:],
                query_start_loc=(m.query_start_loc[nd:n + 1] - m.query_start_loc[nd]).to(torch.int32),
                seq_lens=prefill_seq,
                kv_start_loc=_cumulative(prefill_seq),
                max_query_len=max(query_lens),
                has_context=any(s > q for s, q in zip(prefill_seq_host, query_lens, strict=True)),
                query_start_loc_host=prefill_qsl,
                seq_lens_host=prefill_seq_host,
                kv_start_loc_host=[0, *itertools.accumulate(prefill_seq_host)],
            )
        return AscendMLAMetadata(
            num_reqs=n, max_query_len=m.max_query_len, max_seq_len=m.max_seq_len,
            num_actual_tokens=m.num_actual_tokens, query_start_loc=m.query_start_loc, slot_mapping=m.slot_mapping,
            num_decodes=nd, num_decode_tokens=nd_tokens, num_prefills=npf, decode=decode, prefill=prefill)


class AscendMLAPrefillBackend(MLAPrefillBackend):
    """What vLLM's MLA layer asks the platform for (`get_mla_prefill_backend_cls`) when it is built.

    The Ascend MLA impl computes prefill itself, context and new tokens in one `mla_prefill_attention` call, so the
    layer's separate new-token / context-chunk protocol (with LSE merging) is never driven; a call means another
    impl was paired with this platform, and it fails saying so.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]

    @staticmethod
    def get_name() -> str:
        return "ASCEND_MLA_PREFILL"

    def _not_driven(self, what: str):
        raise NotImplementedError(f"{what}: Ascend MLA prefill runs inside AscendMLAImpl.forward_mha; this backend "
                                  f"only stands for it in vLLM's MLA layer")

    def run_prefill_new_tokens(self, q, k, v, return_softmax_lse, out=None, output_scale=None):
        self._not_driven("run_prefill_new_tokens")

    def run_prefill_context_chunk(self, chunk, q, k, v, out=None):
        self._not_driven("run_prefill_context_chunk")


class AscendMLAImpl(MLAAttentionImpl[AscendMLAMetadata]):
    can_return_lse_for_decode: bool = False
    supports_pcp: bool = False
    supports_dcp: bool = False
    backend_name: ClassVar[str] = "ASCEND_MLA"  # the name the start-up refusals give

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None, attn_type: str, kv_sharing_target_layer_name: str | None,
                 **mla_args: Any) -> None:
        from ascend_platform.attention.validation import check_mla_impl_args

        check_mla_impl_args(alibi_slopes=alibi_slopes, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                            attn_type=attn_type, kv_sharing_target_layer_name=kv_sharing_target_layer_name,
                            kv_cache_dtype=kv_cache_dtype, dcp_world_size=self.dcp_world_size,
                            pcp_world_size=self.pcp_world_size, head_size=head_size,
                            kv_lora_rank=mla_args["kv_lora_rank"], qk_rope_head_dim=mla_args["qk_rope_head_dim"],
                            backend=self.backend_name)
        if attn_type != AttentionType.DECODER:  # checked above; keeps type checkers honest
            raise NotImplementedError(attn_type)
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.q_lora_rank = mla_args["q_lora_rank"]
        self.kv_lora_rank = mla_args["kv_lora_rank"]
        self.qk_nope_head_dim = mla_args["qk_nope_head_dim"]
        self.qk_rope_head_dim = mla_args["qk_rope_head_dim"]
        self.qk_head_dim = mla_args["qk_head_dim"]
        self.v_head_dim = mla_args["v_head_dim"]
        self.kv_b_proj = mla_args["kv_b_proj"]
        self.indexer = mla_args.get("indexer")
        self.q_pad_num_heads = None
        self.supports_quant_query_input = False

    def _views(self, kv_cache: torch.Tensor):
        from ascend_core.kv.views import mla_kv_of

        return mla_kv_of(kv_cache, self.kv_lora_rank)

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        if kv_cache.numel() == 0:  # profiling run before the cache exists
            return
        kv = self._views(kv_cache)
        slots = slot_mapping.flatten()
        n = slots.shape[0]
        kernel_ops().reshape_and_cache_mla(kv_c_normed[:n], k_pe[:n].reshape(n, -1), kv.latent, kv.rope, slots)

    def forward_mqa(self, q, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: AscendMLAMetadata, layer):
        q_nope, q_rope = q if isinstance(q, tuple) else q.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        decode = attn_metadata.decode
        kv = self._views(kv_c_and_k_pe_cache)
        out = kernel_ops().mla_decode_attention(q_nope, q_rope, kv.latent, kv.rope, decode.block_table,
                                                decode.seq_lens, scale=self.scale,
                                                seq_lens_host=decode.seq_lens_host)
        usage.count("attention.ascend_mla.decode_tokens", q_nope.shape[0])
        return out, None

    def forward_mha(self, q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor,
                    kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: AscendMLAMetadata, k_scale: torch.Tensor,
                    output: torch.Tensor, output_scale: torch.Tensor | None = None) -> None:
        if output_scale is not None:
            raise NotImplementedError("ASCEND_MLA: fused output quantization is not supported")
        prefill = attn_metadata.prefill
        ops = kernel_ops()
        if prefill.has_context:
            kv = self._views(kv_c_and_k_pe_cache)
            latent, rope = ops.gather_mla_cache(kv.latent, kv.rope, prefill.block_table, prefill.seq_lens,
                                                seq_lens_host=prefill.seq_lens_host)
            kv_start, kv_start_host = prefill.kv_start_loc, prefill.kv_start_loc_host
            usage.count("attention.ascend_mla.context_prefills")
        else:
            latent, rope = kv_c_normed, k_pe.reshape(k_pe.shape[0], -1)
            kv_start, kv_start_host = prefill.query_start_loc, prefill.query_start_loc_host
        kv_nope = self.kv_b_proj(latent)[0].view(-1, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = kv_nope.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        ops.mla_prefill_attention(q, k_nope, rope.to(q.dtype), v, prefill.query_start_loc, kv_start,
                                  scale=self.scale, out=output.view(-1, self.num_heads, self.v_head_dim),
                                  query_start_loc_host=prefill.query_start_loc_host,
                                  kv_start_loc_host=kv_start_host)
        usage.count("attention.ascend_mla.prefill_tokens", q.shape[0])
