"""The LoRA (punica) ops of the facade against vLLM's own torch ops (`vllm.lora.ops.torch_ops`, what plain vLLM CPU
runs) on tokens that have an adapter, and against punica's rule on tokens that have none (slot -1: no LoRA term,
where vLLM's torch ops apply the last slot's adapter)."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels
from ascend_kernels import ops

SLOTS, RANK, HIDDEN, OUT = 3, 8, 24, 40


def _weights(seed: int, out: int, inner: int, four_dims: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(SLOTS, out, inner, generator=g)
    return w.unsqueeze(1) if four_dims else w


def _upstream():
    # vLLM is in every environment this suite runs in (scripts/test-package builds them on the vLLM base): a missing
    # module is a failure, not a skip.
    import vllm.lora.ops.torch_ops as upstream

    return upstream


def test_bgmv_shrink_and_expand_equal_vllms_torch_ops_on_adapter_rows():
    up = _upstream()
    x = torch.randn(6, HIDDEN)
    a, b = _weights(1, RANK, HIDDEN), _weights(2, OUT, RANK)
    indices = torch.tensor([0, 2, 1, 1, 0, 2])
    ours, theirs = torch.zeros(6, RANK), torch.zeros(6, RANK)
    ops.bgmv_shrink(x, a, ours, indices, 0.5)
    up.bgmv_shrink(x, a, theirs, indices, 0.5)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    y0 = torch.randn(6, OUT + 8)
    ours_y, theirs_y = y0.clone(), y0.clone()
    ops.bgmv_expand(ours, b, ours_y, indices, 4, OUT, True)
    up.bgmv_expand_slice(theirs, b, theirs_y, indices, 4, OUT, True)
    torch.testing.assert_close(ours_y, theirs_y, rtol=0, atol=0)
    # Without a slice: the columns the adapter and the output share (an output wider than the adapter's).
    ours_y, theirs_y = y0.clone(), y0.clone()
    ops.bgmv_expand(ours, b, ours_y, indices, add_inputs=False)
    up.bgmv_expand(theirs, b, theirs_y, indices, add_inputs=False)
    torch.testing.assert_close(ours_y, theirs_y, rtol=0, atol=0)


def test_sgmv_equals_vllms_torch_ops_per_segment():
    up = _upstream()
    seq_lens, slots = torch.tensor([3, 1, 4]), torch.tensor([2, 0, 1])
    x = torch.randn(8, HIDDEN)
    a, b = _weights(3, RANK, HIDDEN, four_dims=False), _weights(4, OUT, RANK)
    meta = (torch.tensor([0, 3, 4]), seq_lens, slots, 3, 4, 8)
    ours, theirs = torch.zeros(8, RANK), torch.zeros(8, RANK)
    ops.sgmv_shrink(x, a, ours, seq_lens, slots, 2.0)
    up.sgmv_shrink(x, a, theirs, *meta, 2.0)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    ours_y, theirs_y = torch.ones(8, OUT), torch.ones(8, OUT)
    ops.sgmv_expand(ours, b, ours_y, seq_lens, slots, 0, OUT, True)
    up.sgmv_expand_slice(theirs, b, theirs_y, *meta, 0, OUT, True)
    torch.testing.assert_close(ours_y, theirs_y, rtol=0, atol=0)


def test_a_token_without_an_adapter_gets_no_lora_term():
    x = torch.randn(4, HIDDEN)
    a, b = _weights(5, RANK, HIDDEN), _weights(6, OUT, RANK)
    indices = torch.tensor([-1, 1, -1, 2])
    buf = torch.full((4, RANK), 7.0)
    ops.bgmv_shrink(x, a, buf, indices, 1.0)
    assert torch.equal(buf[[0, 2]], torch.zeros(2, RANK))
    torch.testing.assert_close(buf[1], x[1] @ a[1, 0].T)
    y0 = torch.randn(4, OUT)
    y = y0.clone()
    ops.bgmv_expand(buf, b, y, indices, add_inputs=True)
    assert torch.equal(y[[0, 2]], y0[[0, 2]])
    torch.testing.assert_close(y[3], y0[3] + buf[3] @ b[2, 0].T)
    # vLLM's torch ops (plain vLLM CPU) index the weights with the -1: those rows get the last slot's adapter.
    up = _upstream()
    theirs = torch.zeros(4, RANK)
    up.bgmv_shrink(x, a, theirs, indices, 1.0)
    torch.testing.assert_close(theirs[0], x[0] @ a[-1, 0].T)
    # A segment without an adapter inside a prefill batch: its rows are untouched too.
    y = y0.clone()
    ops.sgmv_expand(buf, b, y, torch.tensor([2, 2]), torch.tensor([-1, 1]), 0, None, False)
    assert torch.equal(y[:2], y0[:2])
    torch.testing.assert_close(y[2:], buf[2:] @ b[1, 0].T)


def test_arguments_are_checked():
    x = torch.randn(4, HIDDEN)
    a = _weights(7, RANK, HIDDEN)
    assert ascend_kernels.validation_enabled()  # this suite's conftest: the reference backend, checks on
    with pytest.raises(ValueError, match="bgmv_shrink: argument 'indices'"):
        ops.bgmv_shrink(x, a, torch.zeros(4, RANK), torch.zeros(3, dtype=torch.int64), 1.0)
    with pytest.raises(ValueError, match="bgmv_shrink: argument 'weights'"):
        ops.bgmv_shrink(x, a[:, :, :, :-1], torch.zeros(4, RANK), torch.zeros(4, dtype=torch.int64), 1.0)
    with pytest.raises(ValueError, match="sgmv_expand: argument 'size'"):
        ops.sgmv_expand(
            torch.zeros(4, RANK),
            _weights(8, OUT, RANK),
            torch.zeros(4, OUT),
            torch.tensor([4]),
            torch.tensor([0]),
            8,
            OUT,
            True,
        )
    with pytest.raises(ValueError, match="sgmv_shrink: argument 'lora_indices'"):
        ops.sgmv_shrink(x, a, torch.zeros(4, RANK), torch.tensor([4]), torch.tensor([0, 1]), 1.0)
