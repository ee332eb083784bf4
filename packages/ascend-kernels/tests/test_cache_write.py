"""reshape_and_cache / reshape_and_cache_mla against a per-token loop, on strided views of a shared backing."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops
from ascend_kernels.reference import native_build


def _write(formulation, *args):
    """ops.reshape_and_cache, asserting the native loop took the call exactly when it runs and has tokens."""
    before = native_build.calls()["reshape_and_cache"]
    ops.reshape_and_cache(*args)
    took = native_build.calls()["reshape_and_cache"] - before
    assert took == int(formulation == "native" and args[0].shape[0] > 0)


def _naive_write(src, cache, slots):
    expected = cache.clone()
    block_size = cache.shape[1]
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // block_size, slot % block_size] = src[i].to(cache.dtype)
    return expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "slots",
    [
        [],  # empty batch
        [5],  # one token
        [15, 16],  # the last row of block 0, then the first row of block 1 (a block boundary)
        [33, -1, 2, -1, 47, 20],  # padding slots in between
    ],
)
def test_reshape_and_cache_writes_each_token_to_its_slot(strided_caches, dtype, slots, formulation):
    backing, k_cache, v_cache = strided_caches(4, 16, 2, 8, 12, dtype)
    other_layer = backing.view(dtype).view(4, 2, 2, 16, 20)[:, 0].clone()
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    n = len(slots)
    key, value = torch.randn(n, 2, 8), torch.randn(n, 2, 12)
    expected_k = _naive_write(key, k_cache, slot_mapping)
    expected_v = _naive_write(value, v_cache, slot_mapping)
    _write(formulation, key.to(dtype), value.to(dtype), k_cache, v_cache, slot_mapping)
    torch.testing.assert_close(k_cache, expected_k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache, expected_v, rtol=0, atol=0)
    # The write stayed inside this layer's pages of the shared backing.
    assert torch.equal(backing.view(dtype).view(4, 2, 2, 16, 20)[:, 0], other_layer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slots", [[5], [15, 16], [33, -1, 2, -1, 47, 20], [-1, -1]])
def test_dense_planes_are_written_by_slot(dtype, slots, formulation):
    """The device KV layout's dense planes (K for every block, then V, in one region) take the slot-indexed write
    (`_token_rows`); the bytes past both planes stay untouched."""
    from ascend_kernels.reference.cache_write import _token_rows

    region = torch.zeros(2 * 4 * 16 * 2 * 8 + 64, dtype=dtype)
    k_cache = region[: 4 * 16 * 2 * 8].view(4, 16, 2, 8)
    v_cache = region[4 * 16 * 2 * 8 : 2 * 4 * 16 * 2 * 8].view(4, 16, 2, 8)
    assert _token_rows(k_cache) is not None and _token_rows(v_cache) is not None
    slot_mapping = torch.tensor(slots, dtype=torch.int32)
    key, value = torch.randn(len(slots), 2, 8), torch.randn(len(slots), 2, 8)
    expected_k, expected_v = _naive_write(key, k_cache, slot_mapping), _naive_write(value, v_cache, slot_mapping)
    _write(formulation, key.to(dtype), value.to(dtype), k_cache, v_cache, slot_mapping)
    torch.testing.assert_close(k_cache, expected_k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache, expected_v, rtol=0, atol=0)
    assert not region[-64:].any()


@pytest.mark.parametrize(("src", "cache"), [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                            (torch.float16, torch.bfloat16)])
def test_tokens_of_another_dtype_are_rounded_as_torch_rounds(strided_caches, src, cache, formulation):
    """Keys and values of another dtype than the cache are converted as `.to()` converts them (nearest even)."""
    _, k_cache, v_cache = strided_caches(4, 16, 2, 8, 8, cache)
    slot_mapping = torch.tensor([3, -1, 40, 17])
    key, value = (torch.randn(4, 2, 8) * 100).to(src), torch.randn(4, 2, 8).to(src)
    expected_k, expected_v = _naive_write(key, k_cache, slot_mapping), _naive_write(value, v_cache, slot_mapping)
    _write(formulation, key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_a_slot_past_the_caches_is_named_and_nothing_is_written(formulation):
    k_cache, v_cache = torch.zeros(2, 4, 1, 4), torch.zeros(2, 4, 1, 4)
    key = torch.ones(2, 1, 4)
    with pytest.raises(IndexError, match="8" if formulation == "native" else ""):
        ops.reshape_and_cache(key, key, k_cache, v_cache, torch.tensor([1, 8]))
    if formulation == "native":  # the loop checks every slot first (torch's index_copy_ may have written some)
        assert not k_cache.any() and not v_cache.any()


def test_int32_slot_mapping_is_accepted():
    k_cache, v_cache = torch.zeros(2, 4, 1, 4), torch.zeros(2, 4, 1, 4)
    key = torch.arange(8.0).view(2, 1, 4)
    ops.reshape_and_cache(key, key, k_cache, v_cache, torch.tensor([7, 0], dtype=torch.int32))
    assert torch.equal(k_cache[1, 3, 0], key[0, 0]) and torch.equal(k_cache[0, 0, 0], key[1, 0])


@pytest.mark.parametrize("middle_dim", [False, True])
def test_reshape_and_cache_mla(middle_dim):
    nb, bs, rank, rope_dim = 3, 8, 16, 4
    backing = torch.zeros(nb, bs, rank + rope_dim)
    latent_cache = backing[..., :rank].unsqueeze(2)  # strided: the rope columns sit between rows
    rope_cache = backing[..., rank:].unsqueeze(2)
    slots = torch.tensor([0, -1, 8, 23, 7])
    latent, rope = torch.randn(5, rank), torch.randn(5, rope_dim)
    expected_latent = _naive_write(latent[:, None], latent_cache, slots)
    expected_rope = _naive_write(rope[:, None], rope_cache, slots)
    if middle_dim:
        latent, rope = latent[:, None], rope[:, None]
    ops.reshape_and_cache_mla(latent, rope, latent_cache, rope_cache, slots)
    assert torch.equal(latent_cache, expected_latent) and torch.equal(rope_cache, expected_rope)
