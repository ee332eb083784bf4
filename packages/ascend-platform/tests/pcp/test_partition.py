"""The head-and-tail split: covers every token once, balances tokens and causal work, and agrees with vLLM's manager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.worker.gpu.input_batch import InputBuffers

from ascend_platform.pcp import AscendPCPManager, head_tail_chunks, local_tokens_after_padding, rank_token_counts
from ascend_testkit.pcp_batches import step_input_batch


@given(query_len=st.integers(1, 700), pcp=st.integers(1, 4))
def test_chunks_cover_every_token_once(query_len, pcp):
    owned = sorted((off, n) for rank in range(pcp) for off, n in head_tail_chunks(query_len, pcp, rank))
    covered = [t for off, n in owned for t in range(off, off + n)]
    assert covered == list(range(query_len))


@pytest.mark.parametrize("pcp", [2, 4])
def test_head_and_tail_even_out_causal_work(pcp):
    query_len = 2 * pcp * 50
    # Under a causal mask the token at position p attends to p + 1 keys.
    work = [
        sum(p + 1 for off, n in head_tail_chunks(query_len, pcp, r) for p in range(off, off + n)) for r in range(pcp)
    ]
    tokens = rank_token_counts(np.array([query_len]), np.array([True]), pcp)
    assert len(set(tokens.tolist())) == 1
    assert len(set(work)) == 1
    assert head_tail_chunks(query_len, pcp, 0) == ((0, 50), (query_len - 50, 50))


def test_uneven_lengths_and_decodes():
    # 7 tokens, PCP=2: chunks of 2 -> rank 0 owns [0,2) and [6,7), rank 1 owns [2,4) and [4,6).
    assert head_tail_chunks(7, 2, 0) == ((0, 2), (6, 1))
    assert head_tail_chunks(7, 2, 1) == ((2, 2), (4, 2))
    assert head_tail_chunks(1, 2, 1) == ()
    counts = rank_token_counts(np.array([7, 1, 1]), np.array([True, False, False]), 2)
    assert counts.tolist() == [3 + 2, 4 + 2]  # decodes run on every rank
    sharded = rank_token_counts(np.array([7, 1, 1]), np.array([True, False, False]), 2, shard_decode_requests=True)
    assert sharded.tolist() == [3 + 1, 4 + 1]
    with pytest.raises(ValueError, match="rank 2 is outside the PCP group of size 2"):
        head_tail_chunks(7, 2, 2)


def test_padding_never_truncates():
    assert local_tokens_after_padding(151, 76) == 151
    assert local_tokens_after_padding(60, 64) == 64
    assert local_tokens_after_padding(60, None) == 60


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.integers(1, 90), min_size=1, max_size=6), pcp=st.integers(2, 3))
def test_counts_agree_with_the_real_manager(lens, pcp):
    device = torch.device("cpu")
    batch = step_input_batch(InputBuffers(8, 1024, device), lens)
    expected = rank_token_counts(batch.num_scheduled_tokens, batch.is_prefilling_np, pcp)
    for rank in range(pcp):
        manager = AscendPCPManager(pcp, rank, device, max_num_reqs=8, max_num_tokens=1024)
        local = manager.partition_batch(batch, None)
        assert local.num_tokens == expected[rank]
        assert local.num_tokens_after_padding == expected.max()
