"""FIA's documented size and dtype limits, applied through a CardLimits profile (see limits.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascend_testkit.torch_npu.attention.limits import CardLimits
from ascend_testkit.torch_npu.attention.refusals import dtype_names, refuse, unmodelled

MLA_LATENT_DIM, MLA_ROPE_DIM, MLA_MAX_QUERY_LEN = 512, 64, 16
MLA_HEAD_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
TND_HEAD_DIMS = ((128, 128), (192, 128), (192, 192))  # (query/key D, value D) for TND without page attention


@dataclass(frozen=True, kw_only=True)
class FiaShape:
    api: str  # "v1" or "v2"
    token_major: bool
    paged: bool
    block_size: int
    paged_hidden: int | None
    prompt: bool  # some query longer than 1: the PromptFlashAttention branch
    num_heads: int
    num_kv_heads: int
    head_dim: int
    value_dim: int
    rope_dim: int | None
    q_lens: list[int]
    sparse_mode: int
    has_mask: bool


def check_dtypes(op: str, limits: CardLimits, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 token_major: bool, paged: bool, antiquant: bool = False) -> None:
    """`antiquant`: int8 keys and values with their dequant parameters, all checked in antiquant.py."""
    if query.dtype in (torch.int8, torch.uint8) or query.dtype.is_floating_point and query.dtype.itemsize == 1:
        unmodelled(op, "query dtype (quantized attention)", query.dtype)
    if antiquant:
        return
    if key.dtype != query.dtype and key.dtype in (torch.int8, torch.int32):
        unmodelled(op, "key dtype (antiquant KV without dequant parameters)", key.dtype)
    if query.dtype not in limits.attention_dtypes:
        refuse(op, f"query dtype must be one of {dtype_names(limits.attention_dtypes)}, got {query.dtype}")
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype != query.dtype:
            refuse(op, f"{name} dtype {tensor.dtype} must equal query dtype {query.dtype} (no quantization here)")
    if token_major and not paged and query.dtype not in limits.tnd_unpaged_dtypes:
        refuse(op, f"TND/NTD without page attention take {dtype_names(limits.tnd_unpaged_dtypes)} only, "
               f"got query dtype {query.dtype}")


def _check_block_size(op: str, limits: CardLimits, shape: FiaShape, mla_latent: bool) -> None:
    bs = shape.block_size
    if not 0 < bs <= limits.max_block_size:
        refuse(op, f"block_size must be within (0, {limits.max_block_size}] with page attention, got {bs}")
    if mla_latent:
        if limits.mla_block_sizes and bs not in limits.mla_block_sizes:
            refuse(op, f"latent attention (query_rope with D={MLA_LATENT_DIM}) takes block_size in "
                   f"{limits.mla_block_sizes}, got {bs}")
        return
    if bs % limits.block_size_granularity:
        refuse(op, f"block_size must be a multiple of {limits.block_size_granularity}, got {bs}")
    if shape.prompt and bs % limits.prompt_block_size_granularity:
        refuse(op, f"page attention with a query longer than 1 (q lengths {shape.q_lens}) needs block_size a "
               f"multiple of {limits.prompt_block_size_granularity}, got {bs}")
    if shape.paged_hidden is not None and shape.paged_hidden > limits.max_kv_hidden_paged:
        refuse(op, f"a (blocks, block_size, H) cache needs KV_N * D <= {limits.max_kv_hidden_paged}, got "
               f"{shape.paged_hidden}; use GQA or the (blocks, KV_N, block_size, D) cache")


def _check_rope(op: str, limits: CardLimits, shape: FiaShape) -> None:
    if not limits.head_dim_sets:
        return
    if shape.rope_dim != MLA_ROPE_DIM:
        refuse(op, f"query_rope/key_rope must have D={MLA_ROPE_DIM}, got {shape.rope_dim}")
    if shape.head_dim == MLA_LATENT_DIM:
        if not shape.paged:
            refuse(op, f"query_rope with query D={MLA_LATENT_DIM} needs page attention (block_table)")
        if shape.num_kv_heads != 1:
            refuse(op, f"query_rope with query D={MLA_LATENT_DIM} needs one KV head, got {shape.num_kv_heads}")
        if shape.num_heads not in MLA_HEAD_COUNTS:
            refuse(op, f"query_rope with query D={MLA_LATENT_DIM} takes {MLA_HEAD_COUNTS} query heads, got "
                   f"{shape.num_heads}")
        if max(shape.q_lens, default=0) > MLA_MAX_QUERY_LEN:
            refuse(op, f"query_rope with query D={MLA_LATENT_DIM} takes query lengths 1..{MLA_MAX_QUERY_LEN}, "
                   f"got {shape.q_lens}")
        decode_only = max(shape.q_lens, default=0) <= 1
        allowed = {(0, False)} if decode_only else {(3, True)}
        if shape.api == "v1":
            allowed.add((4, True))
        if (shape.sparse_mode, shape.has_mask) not in allowed:
            refuse(op, f"query_rope with query D={MLA_LATENT_DIM} and query lengths {shape.q_lens} takes "
                   f"(sparse_mode, atten_mask given) in {sorted(allowed)}, got ({shape.sparse_mode}, "
                   f"{shape.has_mask})")
    elif shape.head_dim == 128:
        if not shape.token_major or shape.paged:
            refuse(op, "query_rope with query D=128 needs a TND/NTD query without page attention")
        if shape.value_dim != 128:
            refuse(op, f"query_rope with query D=128 needs value D=128, got {shape.value_dim}")
    else:
        refuse(op, f"query_rope needs query D {MLA_LATENT_DIM} or 128, got {shape.head_dim}")


def check_shape(op: str, limits: CardLimits, shape: FiaShape) -> None:
    mla_latent = shape.rope_dim is not None and shape.head_dim == MLA_LATENT_DIM and limits.head_dim_sets
    if shape.paged:
        _check_block_size(op, limits, shape, mla_latent)
    if shape.rope_dim is not None:
        _check_rope(op, limits, shape)
        return
    unpaged_tnd = shape.token_major and not shape.paged
    if limits.head_dim_sets and unpaged_tnd and (shape.head_dim, shape.value_dim) not in TND_HEAD_DIMS:
        refuse(op, f"TND/NTD without page attention take (query/key D, value D) in {TND_HEAD_DIMS}, got "
               f"({shape.head_dim}, {shape.value_dim})")
    if shape.prompt and shape.head_dim % limits.head_dim_alignment:
        refuse(op, f"head dim D={shape.head_dim} must be a multiple of {limits.head_dim_alignment}")
