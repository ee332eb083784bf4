"""The kernel facade's `vision_attention`: the reference against torch's own SDPA per sequence, and the NPU binding
over the testkit's schema-faithful torch_npu against the reference (what a vision tower hands it: packed images and
windows, a repeated offset, GQA heads)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import ascend_kernels
from ascend_kernels import npu_backend, npu_probe, npu_usage, npu_vision
from ascend_kernels import reference as ref
from ascend_testkit import torch_npu as fake

TOL = {"atol": 2e-5, "rtol": 2e-5}
# two images of 6 and 16 rows, then 16 rows split into windows of 4 (one offset repeated: an empty window)
STARTS = [0, 6, 22, 26, 26, 30, 38]


def _qkv(heads=4, kv_heads=2, dim=16, rows=38, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, heads, dim, generator=g), torch.randn(rows, kv_heads, dim, generator=g),
            torch.randn(rows, kv_heads, dim, generator=g))


def _sdpa(q, k, v, starts, scale):
    out = torch.zeros_like(q)
    group = q.shape[1] // k.shape[1]
    for lo, hi in itertools.pairwise(starts):
        if hi > lo:
            out[lo:hi] = F.scaled_dot_product_attention(
                q[lo:hi].transpose(0, 1), k[lo:hi].repeat_interleave(group, 1).transpose(0, 1),
                v[lo:hi].repeat_interleave(group, 1).transpose(0, 1), scale=scale).transpose(0, 1)
    return out


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_reference_is_per_sequence_softmax_attention(kv_heads):
    q, k, v = _qkv(kv_heads=kv_heads)
    offsets = torch.tensor(STARTS, dtype=torch.int32)
    with ascend_kernels.use_backend("reference"):
        ascend_kernels.set_validation(True)
        got = ascend_kernels.ops.vision_attention(q, k, v, offsets, scale=0.25, cu_seqlens_host=STARTS)
    torch.testing.assert_close(got, _sdpa(q, k, v, STARTS, 0.25), **TOL)
    # attention stays inside a sequence: changing one image's keys leaves the other's rows alone
    k2 = k.clone()
    k2[6:22] += 1.0
    other = ref.vision_attention(q, k2, v, offsets, scale=0.25)
    torch.testing.assert_close(other[:6], got[:6])
    assert not torch.allclose(other[6:22], got[6:22])


def test_check_names_a_mismatched_key_length():
    q, k, v = _qkv()
    with ascend_kernels.use_backend("reference"):
        ascend_kernels.set_validation(True)
        with pytest.raises(ValueError, match="vision_attention.*k"):
            ascend_kernels.ops.vision_attention(q, k[:-1], v[:-1], torch.tensor(STARTS), scale=0.25)


@pytest.fixture
def torch_npu():
    module = fake.install("card")  # the sizes and dtypes torch_npu's docs list
    npu_backend._torch_npu.cache_clear()
    yield module
    fake.uninstall()
    npu_backend._torch_npu.cache_clear()
    npu_probe.torch_npu_status.cache_clear()


@pytest.mark.parametrize(("first", "dim"), [(0, 16), (4, 80), (0, 128)])
def test_npu_binding_matches_reference_over_torch_npu(torch_npu, first, dim):
    """FIA in TND over the packed sequences under the card's limits (bfloat16; head dims padded to 128: Qwen2.5-VL's
    80 among them), an empty sequence dropped, rows before the first offset left 0."""
    fake.reset_calls()
    npu_usage.reset()
    q, k, v = (x.bfloat16() for x in _qkv(seed=1, rows=38 + first, dim=dim))
    starts = [s + first for s in STARTS]
    offsets = torch.tensor(starts, dtype=torch.int32)
    got = npu_vision.vision_attention(q, k, v, offsets, scale=0.25, cu_seqlens_host=starts)
    want = ref.vision_attention(q, k, v, offsets, scale=0.25)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert fake.calls() == {"npu_fused_infer_attention_score": 1}
    assert npu_usage.snapshot()["fallbacks"] == {}


def test_npu_binding_runs_the_reference_for_float32_and_says_so(torch_npu):
    fake.reset_calls()
    npu_usage.reset()
    q, k, v = _qkv(seed=2)
    offsets = torch.tensor(STARTS, dtype=torch.int32)
    got = npu_vision.vision_attention(q, k, v, offsets, scale=0.25)
    torch.testing.assert_close(got, ref.vision_attention(q, k, v, offsets, scale=0.25))
    assert fake.calls() == {} and npu_usage.snapshot()["fallbacks"] == {"vision_attention": 1}


@pytest.mark.parametrize("packed", [True, False], ids=["cu_seqlens", "batch_rows"])
def test_ascend_mm_encoder_attention_equals_vllms_sdpa_path(packed):
    """The out-of-tree layer against vLLM's own SDPA path of the same layer: Qwen's packed form (one batch row,
    `cu_seqlens`, 4-D q/k/v) and the batched form (each of 2 rows one sequence, 3-D `[b, s, heads * dim]`)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

    from ascend_platform.attention.vision_attention import register_vision_attention

    register_vision_attention()
    with set_current_vllm_config(VllmConfig()):
        layer = MMEncoderAttention(num_heads=4, head_size=16, scale=0.25, num_kv_heads=2)
    assert type(layer).__name__ == "AscendMMEncoderAttention"
    g = torch.Generator().manual_seed(3)
    if packed:
        q, k, v = (torch.randn(1, 38, h, 16, generator=g) for h in (4, 2, 2))
        cu = torch.tensor(STARTS, dtype=torch.int32)
    else:
        q, k, v = (torch.randn(2, 9, h * 16, generator=g) for h in (4, 2, 2))
        cu = None
    with ascend_kernels.use_backend("reference"):
        got = layer.forward_oot(q, k, v, cu_seqlens=cu)
    torch.testing.assert_close(got, layer.forward_native(q, k, v, cu_seqlens=cu), **TOL)
