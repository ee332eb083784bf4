"""Every test runs on the reference backend with validation on, and leaves the selection as it found it."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels


@pytest.fixture(autouse=True)
def _reference_backend():
    previous = ascend_kernels.validation_enabled()
    ascend_kernels.set_validation(True)
    with ascend_kernels.use_backend("reference"):
        yield
    ascend_kernels.set_validation(previous)


def _strided_caches(num_blocks, block_size, heads, head_size, head_size_v, dtype, *, layers=2, layer=1, seed=0):
    """K and V caches as the allocator builds them: non-contiguous views over one shared int8 backing.

    Backing bytes per block hold every layer's page `[heads, block_size, head_size + head_size_v]` (K and V packed
    per head), so the per-layer `[num_blocks, block_size, heads, head_size]` views are permuted and strided.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    page = heads * block_size * (head_size + head_size_v)
    backing = torch.zeros(num_blocks * layers * page * elem, dtype=torch.int8)
    typed = backing.view(dtype).view(num_blocks, layers, heads, block_size, head_size + head_size_v)
    k = typed[:, layer, :, :, :head_size].permute(0, 2, 1, 3)
    v = typed[:, layer, :, :, head_size:].permute(0, 2, 1, 3)
    gen = torch.Generator().manual_seed(seed)
    k.copy_(torch.randn(k.shape, generator=gen))
    v.copy_(torch.randn(v.shape, generator=gen))
    assert not k.is_contiguous() and not v.is_contiguous()
    return backing, k, v


@pytest.fixture
def strided_caches():
    return _strided_caches
