"""Gumbel-max sampling on its native loop (`native/gumbel.c`) against the torch formulation of the same noise
(`reference.gumbel`, native loops suspended): the same winners over random batches (every logits dtype, greedy rows
beside sampled ones, temperature applied or not, rows strided wider than the vocabulary), the draws following the
softmax they sample, and the calls it leaves to torch. The platform's stand-in parity driver also holds the loop to
vLLM's `_gumbel_sample_kernel`."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels.reference import gumbel as ref_gumbel
from ascend_kernels.reference import native_build, native_gumbel


def _torch_formulation(*args, **kwargs) -> torch.Tensor:
    with native_build.suspended():
        return ref_gumbel.gumbel_sample(*args, **kwargs)


def _batch(g: torch.Generator, rows: int, vocab: int, dtype: torch.dtype, spread: float):
    wide = torch.randn(rows, vocab + 5, generator=g) * spread
    logits = wide.to(dtype)[:, :vocab]  # rows strided wider than the vocabulary
    temperature = torch.rand(rows, generator=g) + 0.05
    temperature[torch.rand(rows, generator=g) < 0.25] = 0.0
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    positions = torch.randint(0, 2**31, (rows,), generator=g)
    return logits, temperature, seeds, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("apply_temperature", [True, False])
def test_winners_equal_the_torch_formulations(native_loops, dtype, apply_temperature):
    g = torch.Generator().manual_seed(int(apply_temperature) + 3 * {torch.float32: 0, torch.bfloat16: 1,
                                                                     torch.float16: 2}[dtype])
    before = native_build.calls_of("gumbel_sample")
    rows_checked = 0
    for case in range(60):
        rows, vocab = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 3000, (1,), generator=g))
        args = _batch(g, rows, vocab, dtype, spread=float(torch.rand(1, generator=g)) * 6)
        native = ref_gumbel.gumbel_sample(*args, apply_temperature=apply_temperature)
        assert torch.equal(native, _torch_formulation(*args, apply_temperature=apply_temperature)), case
        rows_checked += rows
    assert native_build.calls_of("gumbel_sample") == before + 60
    assert rows_checked > 200


@pytest.mark.parametrize("vocab", [32000, 151_936])
def test_large_vocabularies_equal_the_torch_formulations(native_loops, vocab):
    args = _batch(torch.Generator().manual_seed(vocab), 4, vocab, torch.bfloat16, spread=3.0)
    assert torch.equal(ref_gumbel.gumbel_sample(*args), _torch_formulation(*args))


def test_draws_follow_the_softmax(native_loops):
    """20,000 draws of one 5-token row at as many positions: each token's frequency is its softmax probability at
    temperature 0.7 (the noise is a function of the position, so positions are the independent draws)."""
    logits = torch.tensor([[1.0, 0.2, -0.5, 1.4, 0.0]])
    n = 20_000
    drawn = ref_gumbel.gumbel_sample(logits.expand(n, 5), torch.full((n,), 0.7), torch.full((n,), 1234),
                                     torch.arange(n))
    freq = torch.bincount(drawn, minlength=5).double() / n
    want = torch.softmax(logits.double() / 0.7, -1)[0]
    assert (freq - want).abs().max() < 0.015, (freq, want)


def test_greedy_rows_ties_and_nan_take_torchs_argmax(native_loops):
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(2))
    logits[0, [17, 40, 93]] = 50.0
    logits[1, [5, 61]] = math.nan
    out = ref_gumbel.gumbel_sample(logits, torch.tensor([0.0, 0.0, 1.0]), torch.zeros(3, dtype=torch.long),
                                   torch.zeros(3, dtype=torch.long))
    assert out[:2].tolist() == [17, 5]
    assert torch.equal(out, _torch_formulation(logits, torch.tensor([0.0, 0.0, 1.0]),
                                               torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)))


def test_what_the_loop_leaves_to_torch(native_loops):
    logits = torch.randn(2, 50)
    temperature, seeds, positions = torch.ones(2), torch.zeros(2, dtype=torch.long), torch.arange(2)
    state = lambda s, p: ref_gumbel._row_state(s, p, 0)  # noqa: E731
    assert native_gumbel.gumbel_sample(logits.double(), temperature, seeds, positions, state, True) is None
    assert native_gumbel.gumbel_sample(logits.t().contiguous().t(), temperature, seeds, positions, state,
                                       True) is None  # a row not dense
    assert native_gumbel.gumbel_sample(logits[:, :0], temperature, seeds, positions, state, True) is None
    # not one temperature / seed / position a row: the loop would read past them
    assert native_gumbel.gumbel_sample(logits, temperature[:1], seeds, positions, state, True) is None
    assert native_gumbel.gumbel_sample(logits, temperature, seeds[:1], positions[:1], state, True) is None
    before = native_build.calls_of("gumbel_sample")
    ref_gumbel.gumbel_sample(logits, temperature, seeds, positions, fp64=True)  # float64 noise: torch
    assert native_build.calls_of("gumbel_sample") == before
