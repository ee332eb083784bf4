"""Lengths on the host: with the caller's host lists, attention never reads lengths back from the device
(paged attention, MLA decode/prefill and the context cache gather, the context-parallel attention parts).

torch_npu is faked behind the facade (a module standing in for it records what the kernel was launched with);
the length tensors stand for device tensors: reading one back to the host (`tolist`, `int`, `item`) fails the test.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import ascend_kernels
from ascend_kernels import npu_backend, npu_probe, npu_usage, ops, registry


class DeviceLengths(torch.Tensor):
    """A length tensor as if on a device: any read-back to the host raises."""

    def _read_back(self, *args, **kwargs):
        raise AssertionError("lengths were read back from the device")

    tolist = item = cpu = numpy = __int__ = __index__ = __float__ = __bool__ = _read_back


def _device(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).as_subclass(DeviceLengths)


@pytest.fixture
def fake_npu(monkeypatch):
    """Select the 'npu' backend through the facade, with a stand-in torch_npu that records each launch."""
    launches: list[dict] = []

    def fused_infer_attention_score_v2(query, key, value, **kwargs):
        launches.append({"rows": query.shape[0], **kwargs})
        return query.new_zeros(query.shape), None  # [rows, heads, head_size]: the binding copies it out

    fake = types.ModuleType("torch_npu")
    fake.npu_fused_infer_attention_score_v2 = fused_infer_attention_score_v2
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(npu_probe, "torch_npu_status", lambda: npu_probe.TorchNpuStatus(True, 1, "fake", None))
    monkeypatch.setattr(registry._STATE, "loaded", {})  # this test's backends only
    npu_backend._torch_npu.cache_clear()
    npu_usage.reset()
    with ascend_kernels.use_backend("npu"):
        yield launches
    npu_backend._torch_npu.cache_clear()


def _batch(contiguous: bool = True):
    """Two requests: a decode (1 query, 20 cached) and a prefill chunk (3 queries, 7 in context); 1 padding row."""
    gen = torch.Generator().manual_seed(0)
    key_cache = torch.randn(6, 16, 2, 32, generator=gen)
    value_cache = torch.randn(6, 16, 2, 32, generator=gen)
    if not contiguous:  # K and V packed in one backing: views that are not dense, which the kernels refuse
        packed = torch.randn(6, 2, 16, 64, generator=gen)
        key_cache, value_cache = packed[..., :32].permute(0, 2, 1, 3), packed[..., 32:].permute(0, 2, 1, 3)
    return dict(query=torch.randn(5, 4, 32, generator=gen), key_cache=key_cache, value_cache=value_cache,
                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)), [0, 1, 4], [20, 7]


def test_npu_paged_attention_with_host_lengths_never_reads_the_device(fake_npu):
    args, starts, lens = _batch()
    out = ops.paged_attention(**args, query_start_loc=_device(starts), seq_lens=_device(lens), scale=0.2,
                              query_start_loc_host=starts, seq_lens_host=lens)
    (launch,) = fake_npu
    assert npu_usage.snapshot()["npu_ops"] == {"npu_fused_infer_attention_score_v2": 1}
    assert launch["rows"] == 4 and launch["actual_seq_qlen"] == [1, 4] and launch["actual_seq_kvlen"] == [20, 7]
    assert out.shape == (5, 4, 32) and out[4].abs().sum() == 0  # the padding row


def test_npu_paged_attention_without_host_lengths_reads_them_back(fake_npu):
    args, starts, lens = _batch()
    with pytest.raises(AssertionError, match="read back"):
        ops.paged_attention(**args, query_start_loc=_device(starts), seq_lens=_device(lens), scale=0.2)
    out = ops.paged_attention(**args, query_start_loc=torch.tensor(starts, dtype=torch.int32),
                              seq_lens=torch.tensor(lens, dtype=torch.int32), scale=0.2)
    assert fake_npu[-1]["actual_seq_kvlen"] == lens and out.shape == (5, 4, 32)


def test_npu_over_strided_planes_takes_the_host_lengths_too(fake_npu):
    args, starts, lens = _batch(contiguous=False)
    out = ops.paged_attention(**args, query_start_loc=_device(starts), seq_lens=_device(lens), scale=0.2,
                              query_start_loc_host=starts, seq_lens_host=lens)
    # strided caches: FIA on gathered blocks (`npu_paged_planes`), launched from the host lists, nothing read back
    (launch,) = fake_npu
    assert launch["rows"] == 4 and launch["actual_seq_qlen"] == [1, 4] and launch["actual_seq_kvlen"] == lens
    assert launch["block_table"].tolist() == [[0, 1], [2, 3]]  # the gathered blocks, renumbered
    usage = npu_usage.snapshot()
    assert usage["fallbacks"] == {} and usage["paged_planes"] == {"paged_attention": 1}
    assert out.shape == (5, 4, 32)


def test_reference_paged_attention_uses_the_host_lengths():
    args, starts, lens = _batch()
    with_host = ops.paged_attention(**args, query_start_loc=_device(starts), seq_lens=_device(lens), scale=0.2,
                                    query_start_loc_host=starts, seq_lens_host=lens)
    plain = ops.paged_attention(**args, query_start_loc=torch.tensor(starts, dtype=torch.int32),
                                seq_lens=torch.tensor(lens, dtype=torch.int32), scale=0.2)
    torch.testing.assert_close(with_host, plain)


@pytest.mark.parametrize(("name", "value"), [("query_start_loc_host", [0, 1]), ("seq_lens_host", [20, 7.0]),
                                             ("seq_lens_host", torch.tensor([20, 7]))])
def test_host_lengths_of_the_wrong_length_or_type_are_refused(name, value):
    args, starts, lens = _batch()
    kwargs = {"query_start_loc_host": starts, "seq_lens_host": lens, name: value}
    with pytest.raises(ValueError, match=f"'{name}'.*host list of"):
        ops.paged_attention(**args, query_start_loc=torch.tensor(starts, dtype=torch.int32),
                            seq_lens=torch.tensor(lens, dtype=torch.int32), scale=0.2, **kwargs)


@pytest.fixture
def fake_npu_fias(monkeypatch):
    """The MLA and context-parallel bindings' torch_npu kernels, recording each launch."""
    launches: list[dict] = []

    def fused_infer_attention_score(query, key, value, **kwargs):
        launches.append({"op": "fias", "rows": query.shape[0], **kwargs})
        lse = query.new_zeros(query.shape[0], query.shape[1], 1) if kwargs.get("softmax_lse_flag") else None
        # paged (a block table): the value head size is the query's here; else the value rows' own
        head_v = query.shape[-1] if "block_table" in kwargs else value.shape[-1]
        return query.new_zeros(query.shape[:-1] + (head_v,)), lse

    def paged_cache_load(latent_cache, rope_cache, block_table, seq_lens, *, seq_starts, key, value):
        launches.append({"op": "paged_cache_load", "rows": key.shape[0]})

    fake = types.ModuleType("torch_npu")
    fake.npu_fused_infer_attention_score = fused_infer_attention_score
    fake.atb = types.SimpleNamespace(npu_paged_cache_load=paged_cache_load)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(npu_probe, "torch_npu_status", lambda: npu_probe.TorchNpuStatus(True, 1, "fake", None))
    monkeypatch.setattr(registry._STATE, "loaded", {})
    npu_backend._torch_npu.cache_clear()
    with ascend_kernels.use_backend("npu"):
        yield launches
    npu_backend._torch_npu.cache_clear()


def _mla_caches(gen):
    return torch.randn(4, 16, 1, 8, generator=gen), torch.randn(4, 16, 1, 4, generator=gen)


def test_mla_decode_launches_on_the_host_lengths(fake_npu_fias):
    gen = torch.Generator().manual_seed(0)
    latent, rope = _mla_caches(gen)
    out = ops.mla_decode_attention(torch.randn(2, 3, 8, generator=gen), torch.randn(2, 3, 4, generator=gen), latent,
                                   rope, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), _device([20, 7]),
                                   scale=0.3, seq_lens_host=[20, 7])
    assert fake_npu_fias[-1]["actual_seq_lengths_kv"] == [20, 7] and out.shape == (2, 3, 8)


def test_gather_mla_cache_sizes_its_output_from_the_host_lengths(fake_npu_fias):
    gen = torch.Generator().manual_seed(0)
    latent, rope = _mla_caches(gen)
    got_latent, got_rope = ops.gather_mla_cache(latent, rope, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                                                _device([20, 7]), seq_lens_host=[20, 7])
    assert fake_npu_fias[-1] == {"op": "paged_cache_load", "rows": 27}
    assert got_latent.shape == (27, 8) and got_rope.shape == (27, 4)


def test_mla_prefill_launches_on_the_host_offsets(fake_npu_fias):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 2, 12, generator=gen)  # 4 rows of 2 chunks + 1 padding row
    k_nope, k_rope, v = torch.randn(9, 2, 8, generator=gen), torch.randn(9, 4, generator=gen), torch.randn(9, 2, 8)
    out = ops.mla_prefill_attention(q, k_nope, k_rope, v, _device([0, 1, 4]), _device([0, 5, 9]), scale=0.3,
                                    query_start_loc_host=[0, 1, 4], kv_start_loc_host=[0, 5, 9])
    launch = fake_npu_fias[-1]
    assert launch["rows"] == 4 and launch["actual_seq_lengths"] == [1, 4] and launch["actual_seq_lengths_kv"] == [5, 9]
    assert out.shape == (5, 2, 8) and out[4].abs().sum() == 0


def test_attention_with_lse_launches_on_the_host_offsets(fake_npu_fias):
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(5, 2, 8, generator=gen), torch.randn(9, 2, 8, generator=gen), torch.randn(9, 2, 8)
    out, lse = ops.attention_with_lse(q, k, v, _device([0, 1, 4]), _device([0, 5, 9]), scale=0.3,
                                      query_start_loc_host=[0, 1, 4], kv_start_loc_host=[0, 5, 9])
    launch = fake_npu_fias[-1]
    assert launch["actual_seq_lengths"] == [1, 4] and launch["actual_seq_lengths_kv"] == [5, 9]
    assert out.shape == (5, 2, 8) and torch.isinf(lse[4]).all()


def test_paged_attention_with_lse_launches_on_the_host_lengths(fake_npu_fias):
    gen = torch.Generator().manual_seed(0)
    key_cache, value_cache = torch.randn(4, 16, 2, 8, generator=gen), torch.randn(4, 16, 2, 8, generator=gen)
    out, lse = ops.paged_attention_with_lse(torch.randn(5, 2, 8, generator=gen), key_cache, value_cache,
                                            torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), _device([0, 1, 4]),
                                            _device([20, 7]), scale=0.3, causal=False, query_start_loc_host=[0, 1, 4],
                                            seq_lens_host=[20, 7])
    launch = fake_npu_fias[-1]
    assert launch["actual_seq_lengths"] == [1, 4] and launch["actual_seq_lengths_kv"] == [20, 7]
    assert out.shape == (5, 2, 8)


def test_without_host_lengths_the_bindings_read_them_back(fake_npu_fias):
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(5, 2, 8, generator=gen), torch.randn(9, 2, 8, generator=gen), torch.randn(9, 2, 8)
    with pytest.raises(AssertionError, match="read back"):
        ops.attention_with_lse(q, k, v, _device([0, 1, 4]), _device([0, 5, 9]), scale=0.3)


@pytest.mark.parametrize("backend", ["reference"])
def test_the_reference_gives_the_same_results_with_host_lengths(backend):
    gen = torch.Generator().manual_seed(0)
    latent, rope = _mla_caches(gen)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([20, 7], dtype=torch.int32)
    qn, qr = torch.randn(2, 3, 8, generator=gen), torch.randn(2, 3, 4, generator=gen)
    with ascend_kernels.use_backend(backend):
        torch.testing.assert_close(ops.mla_decode_attention(qn, qr, latent, rope, table, lens, scale=0.3),
                                   ops.mla_decode_attention(qn, qr, latent, rope, table, _device([20, 7]), scale=0.3,
                                                            seq_lens_host=[20, 7]))
        for a, b in zip(ops.gather_mla_cache(latent, rope, table, lens),
                        ops.gather_mla_cache(latent, rope, table, lens, seq_lens_host=[20, 7]), strict=True):
            torch.testing.assert_close(a, b)
        kc, vc = torch.randn(4, 16, 2, 8, generator=gen), torch.randn(4, 16, 2, 8, generator=gen)
        q = torch.randn(5, 2, 8, generator=gen)
        qsl = torch.tensor([0, 1, 4], dtype=torch.int32)
        plain = ops.paged_attention_with_lse(q, kc, vc, table, qsl, lens, scale=0.3, causal=False)
        hosted = ops.paged_attention_with_lse(q, kc, vc, table, _device([0, 1, 4]), lens, scale=0.3, causal=False,
                                              query_start_loc_host=[0, 1, 4], seq_lens_host=[20, 7])
        for a, b in zip(plain, hosted, strict=True):
            torch.testing.assert_close(a, b)


def _sfa_batch():
    """The two requests above on SFA caches: indexer keys written for every position, latent + rope pages."""
    gen = torch.Generator().manual_seed(0)
    raw = torch.zeros(4, 16, 128 + 4, dtype=torch.uint8)
    keys = raw[..., :128].view(torch.float8_e4m3fn).unsqueeze(2)
    scales = raw[..., 128:].view(torch.float32).unsqueeze(2)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    slots = torch.cat([torch.arange(20), 32 + torch.arange(7)])
    ops.indexer_cache_write(torch.randn(27, 128, generator=gen), keys, scales, slots)
    q = torch.randn(4, 2, 128, generator=gen).to(torch.float8_e4m3fn)
    latent, rope = _mla_caches(gen)
    return dict(gen=gen, keys=keys, scales=scales, table=table, q=q, w=torch.randn(4, 2, generator=gen),
                latent=latent, rope=rope)


def test_sfa_ops_run_on_the_host_lengths(fake_npu):
    b, starts, lens = _sfa_batch(), [0, 1, 4], [20, 7]
    args = (b["q"], b["w"], b["keys"], b["scales"], b["table"])
    plain = ops.indexer_topk(*args, torch.tensor(starts, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
                             topk=8)
    host = ops.indexer_topk(*args, _device(starts), _device(lens), topk=8, query_start_loc_host=starts,
                            seq_lens_host=lens)
    assert torch.equal(host, plain) and int((plain >= 0).sum()) > 0
    q_nope, q_rope = torch.randn(4, 3, 8, generator=b["gen"]), torch.randn(4, 3, 4, generator=b["gen"])
    attn = (q_nope, q_rope, b["latent"], b["rope"], b["table"])
    expected = ops.sparse_mla_attention(*attn, torch.tensor(starts, dtype=torch.int32), plain, scale=0.3)
    got = ops.sparse_mla_attention(*attn, _device(starts), plain, scale=0.3, query_start_loc_host=starts)
    torch.testing.assert_close(got, expected)
    assert not torch.all(got == 0)


def test_sfa_ops_without_host_lengths_read_them_back(fake_npu):
    b = _sfa_batch()
    with pytest.raises(AssertionError, match="read back"):
        ops.indexer_topk(b["q"], b["w"], b["keys"], b["scales"], b["table"], _device([0, 1, 4]), _device([20, 7]),
                         topk=8)
