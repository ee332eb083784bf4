"""Model Runner V2's greedy sampling rows on their native loop (`native/mrv2_greedy.c`) against torch's argmax of the
float32 logits, which is what the facade's Gumbel sampler (`reference.gumbel.gumbel_sample`) returns for a row of
temperature 0; the platform's stand-in parity driver also holds the loop to vLLM's `_gumbel_sample_kernel`."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels.reference import gumbel as ref_gumbel
from ascend_kernels.reference import native_build, native_mrv2_greedy


def _outputs(rows: int, blocks: int, max_dtype=torch.float32):
    return torch.full((rows, blocks), -7, dtype=torch.int64), torch.full((rows, blocks), 3.0, dtype=max_dtype)


def _expect_winners(argmax, local_max, want: torch.Tensor) -> None:
    assert torch.equal(argmax[:, 0], want)
    assert torch.equal(local_max[:, 0], torch.zeros_like(local_max[:, 0]))
    assert bool((local_max[:, 1:] == -math.inf).all())
    # the launcher's reduction over blocks picks column 0
    assert torch.equal(argmax.gather(-1, local_max.argmax(-1, keepdim=True)).view(-1), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1, 7, 16, 1000, 32000, 151_936])
def test_greedy_rows_take_torchs_argmax(native_loops, dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    rows = 5
    wide = torch.randn(rows, vocab + 9, generator=g).to(dtype)  # rows strided wider than the vocabulary
    logits = wide[:, :vocab]
    idx = torch.tensor([3, -1, 0, 5, 2])
    temperature = torch.rand(8, generator=g) + 0.5
    temperature[[0, 2, 3, 5]] = 0.0
    argmax, local_max = _outputs(rows, 3)
    assert native_mrv2_greedy.gumbel_greedy(logits, idx, temperature, argmax, local_max)
    want = logits.float().argmax(-1)
    _expect_winners(argmax, local_max, want)
    facade = ref_gumbel.gumbel_sample(logits, torch.zeros(rows), torch.zeros(rows, dtype=torch.long),
                                      torch.zeros(rows, dtype=torch.long))
    assert torch.equal(argmax[:, 0], facade)


def test_ties_nan_and_infinities_pick_what_torch_picks(native_loops):
    vocab = 100
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(1))
    logits[0, [17, 40, 93]] = 50.0  # ties in different lanes and in the tail: the lowest id
    logits[1, [33, 97]] = 50.0      # a tie between a lane and the tail
    logits[2, [5, 61]] = math.nan   # the first NaN
    logits[3] = -math.inf           # every token impossible: id 0
    logits[4, 98] = math.inf
    logits[5, [2, 18]] = 9.0        # same lane, twice: the first
    argmax, local_max = _outputs(6, 1, torch.float64)
    assert native_mrv2_greedy.gumbel_greedy(logits, torch.arange(6, dtype=torch.int32), torch.zeros(6), argmax,
                                            local_max)
    want = logits.argmax(-1)
    assert want.tolist() == [17, 33, 5, 0, 98, 2]
    _expect_winners(argmax, local_max, want)


def test_a_row_that_samples_is_left_to_the_gumbel_sampler(native_loops):
    logits = torch.randn(3, 50)
    argmax, local_max = _outputs(3, 2)
    temperature = torch.tensor([0.0, 0.7, 0.0])
    before = native_build.calls_of("gumbel_greedy")
    assert not native_mrv2_greedy.gumbel_greedy(logits, torch.tensor([0, 1, 2]), temperature, argmax, local_max)
    assert bool((argmax == -7).all()) and bool((local_max == 3.0).all())  # nothing written
    assert native_build.calls_of("gumbel_greedy") == before
    assert native_mrv2_greedy.gumbel_greedy(logits, torch.tensor([0, -1, 2]), temperature, argmax, local_max)
    assert native_build.calls_of("gumbel_greedy") == before + 1


def test_a_request_past_the_temperatures_is_named_and_nothing_is_written(native_loops):
    argmax, local_max = _outputs(3, 1)
    with pytest.raises(IndexError, match="batch row 2"):
        native_mrv2_greedy.gumbel_greedy(torch.randn(3, 20), torch.tensor([0, 1, 4]), torch.zeros(4), argmax,
                                         local_max)
    assert bool((argmax == -7).all()) and bool((local_max == 3.0).all())


def test_launches_it_cannot_take_are_left_to_the_caller(native_loops):
    logits, idx = torch.randn(2, 20), torch.tensor([0, 1])
    argmax, local_max = _outputs(2, 1)
    assert not native_mrv2_greedy.gumbel_greedy(logits, idx, torch.zeros(2, dtype=torch.float64), argmax, local_max)
    assert not native_mrv2_greedy.gumbel_greedy(logits.double(), idx, torch.zeros(2), argmax, local_max)
    assert not native_mrv2_greedy.gumbel_greedy(logits.t().contiguous().t(), idx, torch.zeros(2), argmax, local_max)
    assert not native_mrv2_greedy.gumbel_greedy(logits, idx.float(), torch.zeros(2), argmax, local_max)
    assert not native_mrv2_greedy.gumbel_greedy(logits, idx, torch.zeros(2), argmax.int(), local_max)
    assert bool((argmax == -7).all())


def test_without_the_library_nothing_is_taken(torch_formulation):
    argmax, local_max = _outputs(2, 1)
    assert not native_mrv2_greedy.gumbel_greedy(torch.randn(2, 20), torch.tensor([0, 1]), torch.zeros(2), argmax,
                                                local_max)
    assert bool((argmax == -7).all())
