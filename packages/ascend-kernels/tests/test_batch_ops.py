"""compute_slot_mapping, gumbel_sample, gather_logprobs and token_ranks against naive formulations."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops
from ascend_kernels.reference import gumbel as ref_gumbel
from ascend_kernels.reference import native_build

M32 = 0xFFFFFFFF
ALPHA = 1e-3  # chi-square tests reject a correct sampler with probability 0.1 % (fixed seeds make them repeatable)


def chi_square_p_value(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((probs.numel() - 1) / 2, dtype=torch.float64), stat / 2))


def _naive_slots(block_table, req_indices, query_start_loc, positions, block_size, size):
    out = [-1] * size
    for r, req in enumerate(req_indices.tolist()):
        for t in range(int(query_start_loc[r]), int(query_start_loc[r + 1])):
            p = int(positions[t])
            out[t] = -1 if req < 0 else int(block_table[req, p // block_size]) * block_size + p % block_size
    return torch.tensor(out, dtype=torch.int64)


# a mixed batch; a decode batch (one token per request); as many tokens as requests but not one each
QUERY_LENS = pytest.mark.parametrize("query_lens", [[3, 2, 5, 1], [1, 1, 1, 1], [2, 0, 1, 1]])


@QUERY_LENS
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("block_size", [16, 32])
def test_slot_mapping_matches_a_per_token_loop(table_dtype, block_size, query_lens, formulation):
    gen = torch.Generator().manual_seed(block_size)
    block_table = torch.randint(0, 50, (6, 8), generator=gen, dtype=table_dtype)
    req_indices = torch.tensor([4, -1, 0, 2])  # a dummy request (-1) in the middle
    lens = torch.tensor(query_lens)
    total = sum(query_lens)
    qsl = torch.zeros(7, dtype=torch.int32)  # padded past num_reqs + 1, as vLLM's persistent buffer is
    qsl[1:5] = torch.cumsum(lens, 0)
    qsl[5:] = total
    positions = torch.tensor([block_size - 2, block_size - 1, block_size, 0, 7, 0, 1, 2 * block_size - 1,
                              2 * block_size, 5, 100])[:total]  # both sides of block edges
    out = torch.full((16,), 777, dtype=torch.int64)
    before = native_build.calls()["compute_slot_mapping"]
    result = ops.compute_slot_mapping(block_table, req_indices, qsl, positions, block_size, out=out)
    assert result is out
    assert native_build.calls()["compute_slot_mapping"] - before == int(formulation == "native")
    assert torch.equal(out, _naive_slots(block_table, req_indices, qsl, positions, block_size, 16))


def test_slot_mapping_past_the_table_is_named_and_writes_nothing(formulation):
    out = torch.full((4,), 7, dtype=torch.int64)
    with pytest.raises(IndexError, match="positions\\[1\\] = 40" if formulation == "native" else ""):
        ops.compute_slot_mapping(torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0, 1]),
                                 torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([3, 40]), 16, out=out)
    if formulation == "native":
        assert out.tolist() == [7, 7, 7, 7]


def test_slot_mapping_refuses_query_offsets_that_go_backwards(native_loops):
    out = torch.full((4,), 7, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"query_start_loc\[:3\] = \[0, 3, 2\] is not non-decreasing"):
        ops.compute_slot_mapping(torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0, 1]),
                                 torch.tensor([0, 3, 2], dtype=torch.int32), torch.tensor([3, 4, 5]), 16, out=out)
    assert out.tolist() == [7, 7, 7, 7]


def test_slot_mapping_of_an_empty_batch_pads_everything():
    out = torch.zeros(4, dtype=torch.int64)
    ops.compute_slot_mapping(torch.zeros(2, 2, dtype=torch.int32), torch.zeros(0, dtype=torch.int64),
                             torch.zeros(1, dtype=torch.int32), torch.zeros(0, dtype=torch.int64), 16, out=out)
    assert out.tolist() == [-1, -1, -1, -1]


def test_slot_mapping_validation_names_the_argument():
    with pytest.raises(ValueError, match="argument 'out'"):
        ops.compute_slot_mapping(torch.zeros(2, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                                 torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), 16,
                                 out=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="argument 'block_size'"):
        ops.compute_slot_mapping(torch.zeros(2, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                                 torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), 0,
                                 out=torch.zeros(4, dtype=torch.int64))


# ---- gumbel_sample: vLLM MRV2's murmur3 noise, written out with Python ints


def _rotl(x, s):
    return ((x << s) | (x >> (32 - s))) & M32


def _mix(h, key):
    key = _rotl((key * 0xCC9E2D51) & M32, 15)
    key = (key * 0x1B873593) & M32
    h = _rotl(h ^ key, 13)
    return (h * 5 + 0xE6546B64) & M32


def _fmix(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def _naive_hash(seed, pos, token, domain=0):
    h = domain
    for key in (seed & M32, (seed >> 32) & M32, pos & M32, token & M32):
        h = _mix(h, key)
    return _fmix(h ^ 16)


def test_noise_hash_matches_murmur3_written_with_python_ints():
    seeds = [0, 1, -1, 2**62 + 12345, -(2**63)]
    positions = [0, 7, 2**30 + 3, 123456]
    tokens = torch.tensor([0, 1, 999, 151935])
    got = ref_gumbel.hash32(torch.tensor(seeds * 4), torch.tensor(positions * 5), tokens)
    for i, (seed, pos) in enumerate(zip(seeds * 4, positions * 5, strict=True)):
        for j, token in enumerate(tokens.tolist()):
            assert int(got[i, j]) == _naive_hash(seed, pos, token)
    second = ref_gumbel.hash32(torch.tensor([5]), torch.tensor([9]), tokens, domain=0x9E3779B9)
    assert [int(x) for x in second[0]] == [_naive_hash(5, 9, t, 0x9E3779B9) for t in tokens.tolist()]


def test_greedy_rows_take_the_argmax_and_random_rows_repeat_per_seed_and_position():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen)
    logits[0, 3] = logits[0, 7] = 10.0  # a tie: the lowest id wins
    temperature = torch.tensor([0.0, 0.8, 0.8, 1.0, 0.0, 1.3])
    seeds = torch.tensor([1, 2, 2, 3, 4, 5])
    positions = torch.tensor([0, 10, 10, 11, 0, 12])
    first = ops.gumbel_sample(logits, temperature, seeds, positions)
    assert first[0] == 3 and first[4] == logits[4].argmax()
    alone = ops.gumbel_sample(logits[1:2], temperature[1:2], seeds[1:2], positions[1:2])
    assert alone[0] == first[1]  # a row's draw does not depend on its batch
    again = ops.gumbel_sample(logits, temperature, seeds, positions)
    assert torch.equal(first, again)


@pytest.mark.parametrize("fp64", [False, True])
@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_sampled_distribution_is_the_tempered_softmax(fp64, temperature):
    rows = 20000
    base = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -2.0])
    tokens = ops.gumbel_sample(base.repeat(rows, 1), torch.full((rows,), temperature),
                               torch.full((rows,), 42, dtype=torch.long), torch.arange(rows), fp64=fp64)
    assert chi_square_p_value(tokens, torch.softmax(base.double() / temperature, dim=0)) > ALPHA


def test_apply_temperature_false_samples_the_logits_as_given():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    seeds, positions = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    scaled = ops.gumbel_sample(logits / 0.5, torch.full((3,), 0.5), seeds, positions, apply_temperature=False)
    assert torch.equal(scaled, ops.gumbel_sample(logits, torch.full((3,), 0.5), seeds, positions))


def test_gumbel_sample_validation_names_the_argument():
    with pytest.raises(ValueError, match="argument 'seeds'"):
        ops.gumbel_sample(torch.zeros(2, 5), torch.zeros(2), torch.zeros(3, dtype=torch.long),
                          torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="argument 'temperature'"):
        ops.gumbel_sample(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                          torch.zeros(2, dtype=torch.long))


# ---- logprobs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_logprobs_is_log_softmax_at_the_ids(dtype):
    logits = (torch.randn(4, 64, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    ids = torch.randint(0, 64, (4, 3), generator=torch.Generator().manual_seed(3))
    expected = torch.log_softmax(logits.double(), dim=-1).gather(-1, ids)
    got = ops.gather_logprobs(logits, ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)


def test_token_ranks_count_entries_at_or_above_the_token():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 0.0, 2.0]])
    assert ops.token_ranks(logits, torch.tensor([1, 0])).tolist() == [2, 1]  # a tie counts both
    assert ops.token_ranks(logits, torch.tensor([3, 2])).tolist() == [4, 4]
    with pytest.raises(ValueError, match="argument 'token_ids'"):
        ops.token_ranks(logits, torch.tensor([[1], [0]]))
