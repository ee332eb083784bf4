"""Where DeepSeek V4's paged caches keep a request's rows (`ascend_platform.models.deepseek_v4.slots`), checked
against a per-token walk of the block tables."""

from __future__ import annotations

import torch

from ascend_platform.models.deepseek_v4.slots import (
    compressed_slot_mapping,
    paged_slots,
    token_positions,
    token_requests,
    window_positions,
)

# Three requests: a decode (1 token, 11 cached), a prefill chunk continuing 5 cached tokens (6 tokens), a fresh
# prefill (3 tokens); then two padding tokens.
QUERY_START = torch.tensor([0, 1, 7, 10])
SEQ_LENS = torch.tensor([12, 11, 3])
BLOCK_TABLE = torch.tensor([[7, 2, 9], [4, 0, 5], [1, 3, 6]])


def test_token_requests_and_positions_follow_query_start_and_seq_lens():
    requests = token_requests(QUERY_START, 12)
    assert requests.tolist() == [0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0]  # padding maps to request 0
    positions = token_positions(QUERY_START, SEQ_LENS, requests[:10])
    assert positions.tolist() == [11, 5, 6, 7, 8, 9, 10, 0, 1, 2]


def test_paged_slots_walk_the_block_table():
    local = torch.tensor([[0, 3, 4, -1], [5, 8, -1, -1]])
    requests = torch.tensor([0, 1])
    slots = paged_slots(local, requests, BLOCK_TABLE, block_size=4)
    expected = [[7 * 4 + 0, 7 * 4 + 3, 2 * 4 + 0, -1], [0 * 4 + 1, 5 * 4 + 0, -1, -1]]
    assert slots.tolist() == expected


def test_window_positions_cover_the_window_ending_at_each_token():
    covered = window_positions(torch.tensor([1, 20]), 4)
    assert covered.tolist() == [[-1, -1, 0, 1], [17, 18, 19, 20]]


def test_compressed_slot_mapping_gives_the_completing_token_its_state_slot():
    requests = token_requests(QUERY_START, 10)
    positions = token_positions(QUERY_START, SEQ_LENS, requests)
    slot_mapping = torch.arange(10)
    slot_mapping[3] = -1  # a token with no slot of its own (e.g. replayed) writes no compressed state either
    states = compressed_slot_mapping(positions, slot_mapping, requests, BLOCK_TABLE, states_per_block=2, ratio=4)
    expected = []
    for token, (req, pos) in enumerate(zip(requests.tolist(), positions.tolist(), strict=True)):
        if (pos + 1) % 4 or slot_mapping[token] < 0:
            expected.append(-1)
            continue
        state = pos // 4
        expected.append(int(BLOCK_TABLE[req, state // 2]) * 2 + state % 2)
    assert states.tolist() == expected
    # Positions 11 (request 0) and 7 (request 1) complete a state; position 7 has no slot of its own.
    assert [i for i, s in enumerate(expected) if s >= 0] == [0]
