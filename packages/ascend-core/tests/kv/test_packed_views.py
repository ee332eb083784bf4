"""DeepSeek V4's fp8_ds_mla cells get a packed view (its kernels decode them), other quantised cells are refused."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from ascend_core.kv.errors import KVLayoutError
from ascend_core.kv.views import PackedKV, build_layer_kv


def _spec(dtype: torch.dtype, state_content_bytes: int | None) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=512, dtype=dtype, tokens_per_state=4,
                            cache_dtype_str="fp8_ds_mla", alignment=576, model_version="deepseek_v4",
                            state_content_bytes=state_content_bytes)


def test_fp8_ds_mla_cells_are_a_packed_view_of_the_same_bytes():
    blocks, states, cell = 3, 64, 584
    byte_view = torch.zeros(blocks, 1, states, cell, dtype=torch.int8)  # [B, H, N, C]
    kv = build_layer_kv(byte_view, _spec(torch.uint8, 584), "model.layers.1.attn")
    assert isinstance(kv, PackedKV)
    assert kv.cells.shape == (blocks, states, 1, cell) and kv.cells.dtype == torch.uint8
    kv.cells[2, 5, 0, 7] = 200
    assert byte_view[2, 0, 5, 7].item() == 200 - 256  # a view, not a copy


def test_quantised_cells_of_wider_elements_are_refused():
    byte_view = torch.zeros(2, 1, 64, 584 * 2, dtype=torch.int8)
    with pytest.raises(KVLayoutError, match="quantised format"):
        build_layer_kv(byte_view, _spec(torch.bfloat16, 584), "model.layers.1.attn")
