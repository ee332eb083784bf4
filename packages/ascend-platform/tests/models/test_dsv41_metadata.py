"""DeepSeek V4.1's Triton-free metadata builders (`ascend_platform.models.deepseek_v41.backends`) and cache specs
(`caches`), checked against a per-token walk of the batch: the compressed latent's slots (ratio 1 and 2), the
compressor ring's slots, and the specs vLLM's planner groups."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.v1.kv_cache_interface import CircularBufferSpec, MLAAttentionSpec

from ascend_platform.models.deepseek_v41.backends import (
    AscendDSAV41MetadataBuilder,
    AscendDSAV41RingMetadataBuilder,
)

# A decode (1 token, 12 cached), a prefill chunk continuing 5 cached tokens (6 tokens), a fresh prefill (3 tokens).
QUERY_START = torch.tensor([0, 1, 7, 10])
SEQ_LENS = torch.tensor([13, 11, 3])
POSITIONS = [12, 5, 6, 7, 8, 9, 10, 0, 1, 2]
REQUESTS = [0, 1, 1, 1, 1, 1, 1, 2, 2, 2]
BLOCK_TABLE = torch.tensor([[7, 2, 9], [4, 0, 5], [1, 3, 6]])


def _batch(slot_mapping: torch.Tensor, block_table: torch.Tensor = BLOCK_TABLE) -> SimpleNamespace:
    return SimpleNamespace(query_start_loc=QUERY_START, seq_lens=SEQ_LENS, num_actual_tokens=10, max_seq_len=13,
                           slot_mapping=slot_mapping, block_table_tensor=block_table, num_reqs=3)


def _spec(block_size: int, ratio: int) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=512, dtype=torch.float32,
                            tokens_per_state=ratio)


def test_compressed_latent_slots_ratio_2_only_on_the_token_closing_a_pair():
    builder = AscendDSAV41MetadataBuilder(_spec(8, 2), ["l"], None, torch.device("cpu"))
    slot_mapping = torch.arange(10)
    slot_mapping[3] = -1  # position 7 closes (6, 7) but has no slot of its own (e.g. replayed): no entry
    m = builder.build(0, _batch(slot_mapping))
    expected = []
    for token, (req, pos) in enumerate(zip(REQUESTS, POSITIONS, strict=True)):
        if (pos + 1) % 2 or slot_mapping[token] < 0:
            expected.append(-1)
            continue
        entry = pos // 2  # 4 entries per 8-token block
        expected.append(int(BLOCK_TABLE[req, entry // 4]) * 4 + entry % 4)
    assert m.slot_mapping.tolist() == expected
    assert [i for i, s in enumerate(expected) if s >= 0] == [1, 5, 8]  # positions 5, 9, 1
    assert m.block_size == 4 and m.token_to_req_indices.tolist() == REQUESTS


def test_compressed_latent_slots_ratio_1_are_every_token_s_own_row():
    builder = AscendDSAV41MetadataBuilder(_spec(8, 1), ["l"], None, torch.device("cpu"))
    m = builder.build(0, _batch(torch.arange(10)))
    expected = [int(BLOCK_TABLE[r, p // 8]) * 8 + p % 8 for r, p in zip(REQUESTS, POSITIONS, strict=True)]
    assert m.slot_mapping.tolist() == expected and m.block_size == 8


def test_ring_slots_are_block_times_capacity_plus_position_mod_capacity_and_skip_the_null_block():
    spec = CircularBufferSpec(block_size=8, num_kv_heads=1, head_size=1024, head_size_v=0, dtype=torch.float32)
    builder = AscendDSAV41RingMetadataBuilder(spec, ["ring"], None, torch.device("cpu"))
    ring_table = torch.tensor([[3, 0], [0, 0], [5, 0]])  # request 1 holds the null block (e.g. a dummy request)
    m = builder.build(0, _batch(torch.full((12,), -1), ring_table))
    expected = [3 * 8 + 12 % 8] + [-1] * 6 + [5 * 8 + p for p in (0, 1, 2)]
    assert m.slot_mapping.tolist() == expected
    assert m.query_start_loc is QUERY_START and m.token_to_req_indices.tolist()[:10] == REQUESTS
