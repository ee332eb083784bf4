"""The fake torch_npu's KV antiquant (FIA _v2 over int8 caches, npu_anti_quant) against plain float64 formulas, its
documented refusals, and the int8 KV cache bindings (`ascend_kernels.npu_kv_quant`) over it against the reference
kernels."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels import npu_backend, npu_kv_quant, npu_usage
from ascend_kernels.reference import kv_quant as ref
from ascend_testkit import torch_npu as fake
from ascend_testkit.torch_npu.attention import CARD, TINY_MODELS, implementations
from ascend_testkit.torch_npu.quant import npu_anti_quant

TINY, ON_CARD = implementations(TINY_MODELS), implementations(CARD)
FIA = "npu_fused_infer_attention_score_v2"


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _int8_pages(lengths, block_size, heads, dim, seed=0):
    """Per-request int8 [len, heads, dim] rows scattered into [blocks, block_size, heads * dim] pages (shuffled)."""
    g = _g(seed)
    rows = [torch.randint(-128, 128, (n, heads, dim), generator=g, dtype=torch.int8) for n in lengths]
    needs = [-(-n // block_size) for n in lengths]
    blocks = sum(needs) + 2
    order = torch.randperm(blocks, generator=g)
    cache = torch.zeros(blocks, block_size, heads, dim, dtype=torch.int8)
    table = torch.zeros(len(lengths), max(needs), dtype=torch.int32)
    used = 0
    for b, r in enumerate(rows):
        for n in range(needs[b]):
            table[b, n] = int(order[used])
            chunk = r[n * block_size:(n + 1) * block_size]
            cache[int(order[used]), :chunk.shape[0]] = chunk
            used += 1
    return rows, cache, table


def _decode_by_hand(q, keys, values, *, scale, k_scale, k_offset, v_scale, v_offset):
    """One query per request, float64: keys / values dequantized as (x + offset) * scale per channel."""
    heads, dim = q.shape[1], q.shape[2]
    out = torch.zeros(q.shape[0], heads, dim, dtype=torch.float64)
    for b in range(q.shape[0]):
        kv_heads = keys[b].shape[1]
        k = (keys[b].double().reshape(-1, kv_heads * dim) + k_offset) * k_scale
        v = (values[b].double().reshape(-1, kv_heads * dim) + v_offset) * v_scale
        k, v = k.view(-1, kv_heads, dim), v.view(-1, kv_heads, dim)
        for h in range(heads):
            kh = h // (heads // kv_heads)
            logits = [scale * float(q[b, h].double() @ k[j, kh]) for j in range(k.shape[0])]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            out[b, h] = sum(w * v[j, kh] for j, w in enumerate(weights)) / sum(weights)
    return out


def _decode_call(lengths=(130, 5, 64), heads=4, kv_heads=2, dim=32, block_size=128, form="channel", **overrides):
    g = _g(1)
    keys, k_cache, table = _int8_pages(lengths, block_size, kv_heads, dim, seed=2)
    values, v_cache, _ = _int8_pages(lengths, block_size, kv_heads, dim, seed=2)
    values = [v.flip(-1) for v in values]  # distinct from the keys, same pages
    v_cache = v_cache.flip(-1).contiguous()
    q = torch.randn(len(lengths), heads, 1, dim, generator=g).bfloat16()
    shape = {"channel": (1, kv_heads, 1, dim), "hidden": (1, kv_heads * dim), "tensor": (1,)}[form]
    numel = math.prod(shape)
    params = {name: ((torch.rand(numel, generator=g) * 0.02 + 0.005) if "scale" in name
                     else torch.randint(-9, 9, (numel,), generator=g).double()).bfloat16().view(shape)
              for name in ("dequant_scale_key", "dequant_offset_key", "dequant_scale_value", "dequant_offset_value")}
    call = dict(query=q, key=k_cache.view(k_cache.shape[0], block_size, -1),
                value=v_cache.view(v_cache.shape[0], block_size, -1), num_query_heads=heads,
                num_key_value_heads=kv_heads, input_layout="BNSD", softmax_scale=0.2, block_table=table,
                block_size=block_size, actual_seq_kvlen=list(lengths), key_quant_mode=0, value_quant_mode=0, **params)
    call.update(overrides)
    return call, keys, values


@pytest.mark.parametrize("form", ["channel", "hidden", "tensor"])
def test_incremental_paged_int8_dequantizes_per_channel_in_float64(form):
    call, keys, values = _decode_call(form=form)
    out, _ = ON_CARD[FIA](**call)
    kv = call["num_key_value_heads"] * call["query"].shape[-1]
    flat = {k: call[k].double().reshape(-1).expand(kv) for k in call if k.startswith("dequant_")}
    expected = _decode_by_hand(call["query"][:, :, 0], keys, values, scale=0.2, k_scale=flat["dequant_scale_key"],
                               k_offset=flat["dequant_offset_key"], v_scale=flat["dequant_scale_value"],
                               v_offset=flat["dequant_offset_value"])
    assert out.shape == call["query"].shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out[:, :, 0].double(), expected, atol=1e-2, rtol=1e-2)


def test_symmetric_antiquant_takes_no_offsets():
    call, keys, values = _decode_call(dequant_offset_key=None, dequant_offset_value=None)
    out, _ = ON_CARD[FIA](**call)
    kv = call["num_key_value_heads"] * call["query"].shape[-1]
    zero = torch.zeros(kv, dtype=torch.float64)
    expected = _decode_by_hand(call["query"][:, :, 0], keys, values, scale=0.2,
                               k_scale=call["dequant_scale_key"].double().reshape(-1), k_offset=zero,
                               v_scale=call["dequant_scale_value"].double().reshape(-1), v_offset=zero)
    torch.testing.assert_close(out[:, :, 0].double(), expected, atol=1e-2, rtol=1e-2)


def _prompt(call):
    """The same pages with two query tokens per request (the prompt branch), in TND."""
    q = call["query"]
    t = torch.cat([q[:, :, 0], q[:, :, 0]]).contiguous()
    return dict(call, query=t, input_layout="TND", actual_seq_qlen=[2, 4, 6],
                atten_mask=torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1), sparse_mode=3)


REFUSALS = {
    "page attention with a longer query": (lambda c: dict(c, input_layout="BNSD", query=torch.cat(
        [c["query"], c["query"]], dim=2)), "page attention takes no KV antiquant when a query is longer"),
    "TND": (_prompt, "TND / NTD layouts take no KV antiquant"),
    "key offset only": (lambda c: dict(c, dequant_offset_value=None), "must be given together"),
    "offsets without scales": (lambda c: dict(c, dequant_scale_key=None, dequant_scale_value=None),
                               "given without dequant_scale_key"),
    "scale dtype": (lambda c: dict(c, dequant_scale_key=c["dequant_scale_key"].float(),
                                   dequant_scale_value=c["dequant_scale_value"].float()),
                    "dtype must be the query's"),
    "scale shape": (lambda c: dict(c, dequant_scale_key=c["dequant_scale_key"].reshape(2, 32),
                                   dequant_scale_value=c["dequant_scale_value"].reshape(2, 32)),
                    "per channel"),
    "modes differ": (lambda c: dict(c, key_quant_mode=1, value_quant_mode=0), r"must be equal \(or 0 and 1\)"),
    "float keys": (lambda c: dict(c, key=c["key"].bfloat16(), value=c["value"].bfloat16()), "must be int8 with KV"),
    "float32 query": (lambda c: dict(c, query=c["query"].float()), "float16 / bfloat16 query"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_antiquant_refusals_as_documented(case):
    edit, message = REFUSALS[case]
    call, _, _ = _decode_call()
    with pytest.raises(ValueError, match=message):
        ON_CARD[FIA](**edit(call))


def test_int8_pages_need_a_block_size_of_32_on_the_card():
    call, _, _ = _decode_call(lengths=(40, 5), block_size=16)
    with pytest.raises(ValueError, match="int8 caches needs block_size a multiple of 32"):
        ON_CARD[FIA](**call)
    TINY[FIA](**call)  # the tiny-model profile drops the size lists, not the structure


def test_other_quant_modes_are_unmodelled():
    call, _, _ = _decode_call(key_quant_mode=1, value_quant_mode=1)
    with pytest.raises(NotImplementedError, match="key_quant_mode/value_quant_mode"):
        ON_CARD[FIA](**call)


def test_anti_quant_is_x_plus_offset_times_scale_on_the_last_axis():
    x = torch.randint(-128, 128, (3, 2, 8), generator=_g(4), dtype=torch.int8)
    scale, offset = torch.rand(8, generator=_g(5)), torch.randint(-5, 5, (8,), generator=_g(6)).float()
    out = npu_anti_quant(x=x, scale=scale, offset=offset, dst_dtype=15, src_dtype=None)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ((x.double() + offset.double()) * scale.double()).bfloat16().double())
    assert npu_anti_quant(x=x, scale=scale[:1], offset=None, dst_dtype=None, src_dtype=None).dtype == torch.float16
    with pytest.raises(ValueError, match="offset must have scale's shape"):
        npu_anti_quant(x=x, scale=scale, offset=offset[:1], dst_dtype=15, src_dtype=None)


# -- the bindings over the installed fake ---------------------------------------------------------------------------

@pytest.fixture
def torch_npu():
    fake.uninstall()
    module = fake.install("card")
    npu_backend._torch_npu.cache_clear()
    npu_usage.reset()
    yield module
    fake.uninstall()
    npu_backend._torch_npu.cache_clear()


def _scales(channels, seed):
    g = _g(seed)
    scale = (torch.rand(channels, generator=g) * 0.02 + 0.01).bfloat16().float()
    offset = torch.randint(-20, 20, (channels,), generator=g).float()
    return scale, offset


def _filled_caches(lengths, block_size=128, kv_heads=2, dim=32, seed=0):
    """int8 caches written through the binding (npu_quantize + the ATB cache write), and the float K/V written."""
    g = _g(seed)
    total = sum(lengths)
    blocks = sum(-(-n // block_size) for n in lengths) + 1
    k_cache = torch.zeros(blocks, block_size, kv_heads, dim, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(total, kv_heads, dim, generator=g).bfloat16()
    value = torch.randn(total, kv_heads, dim, generator=g).bfloat16()
    (ks, ko), (vs, vo) = _scales(kv_heads * dim, seed + 1), _scales(kv_heads * dim, seed + 2)
    table = torch.zeros(len(lengths), max(-(-n // block_size) for n in lengths), dtype=torch.int32)
    slots, block = [], 1  # block 0 is vLLM's null block
    for r, n in enumerate(lengths):
        for j in range(-(-n // block_size)):
            table[r, j] = block + j
        slots += [(block + i // block_size) * block_size + i % block_size for i in range(n)]
        block += -(-n // block_size)
    slot_mapping = torch.tensor(slots + [-1])  # one padding token
    pad = torch.zeros(1, kv_heads, dim, dtype=key.dtype)
    npu_kv_quant.reshape_and_cache_quant(torch.cat([key, pad]), torch.cat([value, pad]), k_cache, v_cache,
                                         slot_mapping, ks, ko, vs, vo)
    return dict(key_cache=k_cache, value_cache=v_cache, block_table=table, key_scale=ks, key_offset=ko,
                value_scale=vs, value_offset=vo), key, value, slot_mapping


def test_quantized_cache_write_binds_npu_quantize_then_the_atb_write(torch_npu):
    caches, key, value, slots = _filled_caches([130, 7])
    want_k = torch.zeros_like(caches["key_cache"])
    want_v = torch.zeros_like(want_k)
    ref.reshape_and_cache_quant(key, value, want_k, want_v, slots[:-1], caches["key_scale"], caches["key_offset"],
                                caches["value_scale"], caches["value_offset"])
    # Both multiply by the float32 reciprocal: the same integers, the null block (padding) aside.
    assert torch.equal(caches["key_cache"][1:], want_k[1:]) and torch.equal(caches["value_cache"][1:], want_v[1:])
    assert npu_usage.snapshot()["npu_ops"] == {"npu_quantize": 2, "_npu_reshape_and_cache": 1}
    assert npu_usage.snapshot()["fallbacks"] == {}


def _attend(caches, q_lens, kv_lens, seed=9):
    q = torch.randn(sum(q_lens), 4, 32, generator=_g(seed)).bfloat16()
    starts = [0] + [sum(q_lens[:i + 1]) for i in range(len(q_lens))]
    args = dict(caches, query=q, query_start_loc=torch.tensor(starts, dtype=torch.int32),
                seq_lens=torch.tensor(kv_lens, dtype=torch.int32), scale=0.17)
    npu_usage.reset()
    got = npu_kv_quant.paged_attention_antiquant(**args, query_start_loc_host=starts, seq_lens_host=list(kv_lens))
    ran = dict(npu_usage.snapshot()["npu_ops"])
    want = ref.paged_attention_antiquant(**args)
    return got, want, ran


def test_decode_only_batches_run_fia_over_the_int8_pages(torch_npu):
    caches, _, _, _ = _filled_caches([130, 7])
    got, want, ran = _attend(caches, [1, 1], [130, 7])
    assert ran == {FIA: 1}, ran
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert npu_usage.snapshot()["fallbacks"] == {}


def test_prefill_rows_dequantize_their_blocks_then_run_the_float_paged_fia(torch_npu):
    caches, _, _, _ = _filled_caches([130, 7])
    got, want, ran = _attend(caches, [3, 1], [130, 7])  # a chunk continuing a context past a block edge + a decode
    assert ran == {"npu_anti_quant": 2, FIA: 1}, ran
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert npu_usage.snapshot()["fallbacks"] == {}
