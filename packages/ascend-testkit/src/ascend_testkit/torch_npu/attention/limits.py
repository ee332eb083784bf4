"""What a card refuses beyond the structure of the arguments: the sizes and dtypes the torch_npu docs list.

Structural rules (layouts, shapes agreeing, sparse_mode and mask forms, block tables, contiguity) are always
enforced. The numeric limits here are a profile because the docs' lists (head dims 128/192/512, block sizes that are
multiples of 128, bfloat16-only TND) would refuse every tiny test model: `CARD` is the card as documented,
`TINY_MODELS` keeps the structure and drops the size lists so small float32 models can run through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class CardLimits:
    name: str
    attention_dtypes: tuple[torch.dtype, ...]  # query/key/value dtypes the kernel computes in
    tnd_unpaged_dtypes: tuple[torch.dtype, ...]  # TND without page attention: the docs say bfloat16 only
    sink_dtypes: tuple[torch.dtype, ...]
    head_dim_sets: bool  # TND head dims 128/192, MLA 512/128 with rope 64, MLA head counts and q lengths <= 16
    head_dim_alignment: int  # prompt branch: D a multiple of this (fp16/bf16: 16); 1 = any
    max_heads: int
    max_gqa_ratio: int
    max_kv_hidden_paged: int  # (blocks, block_size, H) caches: KV_N * D at most this
    block_size_granularity: int  # every paged call
    int8_block_size_granularity: int  # paged call over int8 caches (KV antiquant)
    prompt_block_size_granularity: int  # paged call with some query longer than 1 (the PromptFlashAttention branch)
    max_block_size: int
    mla_block_sizes: tuple[int, ...]  # query_rope with D=512 (latent attention over the paged cache)
    cache_load_alignment_bytes: int  # npu_paged_cache_load: heads * head_size * itemsize a multiple of this


CARD = CardLimits(
    name="card",
    attention_dtypes=(torch.float16, torch.bfloat16),
    tnd_unpaged_dtypes=(torch.bfloat16,),
    sink_dtypes=(torch.bfloat16,),
    head_dim_sets=True,
    head_dim_alignment=16,
    max_heads=256,
    max_gqa_ratio=64,
    max_kv_hidden_paged=65535,
    block_size_granularity=16,
    int8_block_size_granularity=32,
    prompt_block_size_granularity=128,
    max_block_size=512,
    mla_block_sizes=(16, 128),
    cache_load_alignment_bytes=32,
)

TINY_MODELS = CardLimits(
    name="tiny-models",
    attention_dtypes=(torch.float16, torch.bfloat16, torch.float32),
    tnd_unpaged_dtypes=(torch.float16, torch.bfloat16, torch.float32),
    sink_dtypes=(torch.float16, torch.bfloat16, torch.float32),
    head_dim_sets=False,
    head_dim_alignment=1,
    max_heads=256,
    max_gqa_ratio=64,
    max_kv_hidden_paged=65535,
    block_size_granularity=1,
    int8_block_size_granularity=1,
    prompt_block_size_granularity=1,
    max_block_size=512,
    mla_block_sizes=(),
    cache_load_alignment_bytes=1,
)
