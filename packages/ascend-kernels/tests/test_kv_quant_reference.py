"""The int8 KV cache ops (ModelSlim's C8) against float64 formulations of their contracts, through the facade
(reference backend, argument checks on)."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops, use_backend


@pytest.fixture(autouse=True)
def _reference():
    with use_backend("reference"):
        yield


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _params(channels: int, seed: int, per_tensor: bool = False):
    g = _g(seed)
    n = 1 if per_tensor else channels
    return (torch.rand(n, generator=g) * 0.03 + 0.01), torch.randint(-30, 30, (n,), generator=g).float()


@pytest.mark.parametrize("per_tensor", [False, True])
def test_cache_write_quantizes_each_channel_then_scatters_by_slot(per_tensor):
    h, d, bs = 2, 8, 4
    key = (torch.randn(5, h, d, generator=_g(1)) * 2).bfloat16()
    value = torch.randn(5, h, d, generator=_g(2)).bfloat16()
    key[0, 0, 0], key[0, 0, 1] = 1e4, -1e4  # saturate
    (ks, ko), (vs, _) = _params(h * d, 3, per_tensor), _params(h * d, 4, per_tensor)
    k_cache = torch.zeros(3, bs, h, d, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([5, 6, -1, 0, 11])  # a padding token writes nothing
    ops.reshape_and_cache_quant(key, value, k_cache, v_cache, slots, ks, ko, vs, None)
    recip = (1.0 / ks.float()).double()
    want_k = torch.round(key.double().reshape(5, -1) * recip + ko.double()).clamp(-128, 127).view(5, h, d)
    want_v = torch.round(value.double().reshape(5, -1) * (1.0 / vs.float()).double()).clamp(-128, 127).view(5, h, d)
    for row, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot // bs, slot % bs].double(), want_k[row])
            assert torch.equal(v_cache[slot // bs, slot % bs].double(), want_v[row])
    assert k_cache[1, 1, 0, 0] == 127 and k_cache[1, 1, 0, 1] == -128  # token 0 (slot 5) saturates both ways
    assert not k_cache[2, :3].any()  # slots 8..10 untouched


def _float64_attention(q, keys, values, q_lens, scale):
    """Causal attention of each request's last q_len positions over its float64 [len, KV_N, D] keys / values."""
    out = torch.zeros(q.shape[0], q.shape[1], values[0].shape[-1], dtype=torch.float64)
    start = 0
    for b, n in enumerate(q_lens):
        k, v = keys[b], values[b]
        group = q.shape[1] // k.shape[1]
        kv_len = k.shape[0]
        for i in range(n):
            pos = kv_len - n + i
            logits = torch.einsum("hd,jhd->hj", q[start + i].double(), k.repeat_interleave(group, 1)[:pos + 1])
            w = torch.softmax(logits * scale, dim=-1)
            out[start + i] = torch.einsum("hj,jhd->hd", w, v.repeat_interleave(group, 1)[:pos + 1])
        start += n
    return out


def test_attention_reads_the_int8_pages_as_offset_shifted_scaled_values():
    h, hkv, d, bs = 4, 2, 8, 4
    kv_lens, q_lens = [9, 3], [2, 1]
    g = _g(7)
    blocks = 8
    k_cache = torch.randint(-128, 128, (blocks, bs, hkv, d), generator=g, dtype=torch.int8)
    v_cache = torch.randint(-128, 128, (blocks, bs, hkv, d), generator=g, dtype=torch.int8)
    table = torch.tensor([[5, 2, 7], [3, 0, 0]], dtype=torch.int32)  # block 0 as padding past request 1's context
    (ks, ko), (vs, vo) = _params(hkv * d, 8), _params(hkv * d, 9)
    q = torch.randn(sum(q_lens), h, d, generator=g).bfloat16()
    out = ops.paged_attention_antiquant(
        q, k_cache, v_cache, table, torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor(kv_lens,
        dtype=torch.int32), key_scale=ks, key_offset=ko, value_scale=vs, value_offset=vo, scale=0.3)

    def dequant(cache, row, n, scale, offset):
        rows = cache[table[row].long()].reshape(-1, hkv * d)[:n].double()
        # the contract: (q - offset) * scale, in the query's dtype
        return ((rows - offset.double()) * scale.double()).bfloat16().double().view(n, hkv, d)

    keys = [dequant(k_cache, r, n, ks, ko) for r, n in enumerate(kv_lens)]
    values = [dequant(v_cache, r, n, vs, vo) for r, n in enumerate(kv_lens)]
    want = _float64_attention(q, keys, values, q_lens, 0.3)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2)


CHECKS = {
    "float caches": (dict(key_cache=torch.zeros(4, 4, 2, 8).bfloat16()), "an int8 .num_blocks"),
    "scale length": (dict(key_scale=torch.ones(8)), r"float32 \[16\] \(num_kv_heads \* head_size\) or \[1\]"),
    "scale dtype": (dict(value_scale=torch.ones(16).bfloat16()), "value_scale"),
    "offset length": (dict(value_offset=torch.zeros(3)), "value_offset"),
}


@pytest.mark.parametrize("case", sorted(CHECKS))
def test_attention_arguments_are_checked(case):
    edit, message = CHECKS[case]
    args = dict(query=torch.zeros(1, 4, 8).bfloat16(), key_cache=torch.zeros(4, 4, 2, 8, dtype=torch.int8),
                value_cache=torch.zeros(4, 4, 2, 8, dtype=torch.int8), block_table=torch.zeros(1, 1, dtype=torch.int32),
                query_start_loc=torch.tensor([0, 1], dtype=torch.int32), seq_lens=torch.tensor([1], dtype=torch.int32),
                key_scale=torch.ones(16), value_scale=torch.ones(16), scale=1.0)
    args.update(edit)
    with pytest.raises(ValueError, match=message):
        ops.paged_attention_antiquant(**args)
