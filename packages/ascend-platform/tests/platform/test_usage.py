"""Usage counting: every kernel op call counts itself once the platform reaches the kernels (no caller counts its
own), and counters fed from tensors stay on the device until read."""

from __future__ import annotations

import torch

from ascend_platform import usage
from ascend_platform.facade import kernel_ops


def _counts() -> dict:
    return usage.snapshot()["counts"]


def test_each_kernel_op_call_counts_and_times_itself_under_its_facade_name():
    ops = kernel_ops()
    before = _counts()
    seconds_before = usage.snapshot()["seconds"].get("kernels.rms_norm", 0.0)
    x, w = torch.randn(3, 8), torch.ones(8)
    ops.rms_norm(x, w, 1e-6)
    ops.rms_norm(x, w, 1e-6, torch.zeros(3, 8))
    ops.silu_and_mul(torch.randn(3, 8))
    after = _counts()
    assert after["kernels.rms_norm"] - before.get("kernels.rms_norm", 0) == 2
    assert after["kernels.silu_and_mul"] - before.get("kernels.silu_and_mul", 0) == 1
    assert usage.snapshot()["seconds"]["kernels.rms_norm"] > seconds_before


def test_a_kernel_call_made_without_the_facade_function_is_counted_too():
    kernel_ops()  # the platform reached the kernels once in this process
    from ascend_kernels import ops  # e.g. ascend_specdecode's verification calls the module directly

    before = _counts().get("kernels.silu_and_mul", 0)
    ops.silu_and_mul(torch.randn(2, 4))
    assert _counts()["kernels.silu_and_mul"] == before + 1


def test_a_counter_fed_from_tensors_adds_their_true_flags_when_read():
    usage.count_on_device("test.flags", torch.tensor([True, False, True]))
    usage.count_on_device("test.flags", torch.tensor([1, 1, 1, 0]))
    assert _counts()["test.flags"] == 5
