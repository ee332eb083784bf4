"""ModelSlim's C8 int8 KV cache served end to end on a GQA tiny Llama (4 query heads over 2 KV heads): the simulated
lane (V1 and Model Runner V2) against transformers in float64 with every cached key and value put through the same
int8 round trip (the checkpoint's per-channel scales and offsets), over prompts inside, decoding across and
prefilled (in 64-token chunks) across a 128-token block edge; the KV cache our allocator cut is int8, half of
bfloat16's bytes per block; the C8 kernels are counted; and the NPU kernel backend over the testkit's torch_npu runs
it with nothing falling back."""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

pytestmark = pytest.mark.engine

NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 2, 32, 128  # the C8 Llama's (conftest.c8_model) and the engines'
C8_OPS = {"kernels.reshape_and_cache_quant", "kernels.paged_attention_antiquant"}


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_c8_engine_matches_float64_with_the_same_int8_kv_round_trip(c8_runs, c8_reference, runner):
    ours = c8_runs[(runner, "c8")]
    assert ours["facts"]["kernel_backend"] == "reference"
    check_logprobs_close(ours["outputs"], c8_reference, name_0="ascend C8", name_1="float64 with int8 KV round trip")
    counted = {k for k, n in ours["counts"].items() if n > 0}
    # Every layer's cache is int8: the C8 kernels ran, the float ones never did.
    assert counted >= C8_OPS and not counted & {"kernels.reshape_and_cache", "kernels.paged_attention"}, counted


def test_c8_kv_cache_is_int8_with_half_the_bytes_per_block_of_bfloat16(c8_runs):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    ours = c8_runs[("v1", "c8")]
    layers = ours["kv_layers"]
    assert len(layers) == 2 and {v["dtype"] for v in layers.values()} == {"torch.int8"}, layers
    assert {v["kind"] for v in layers.values()} == {"AttentionKV"}
    assert {v["bytes_per_token"] for v in layers.values()} == {2 * NUM_KV_HEADS * HEAD_DIM}
    # vLLM's own page size of the same layer with a bfloat16 cache, against the pages it planned for ours.
    bf16 = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_DIM,
                             dtype=torch.bfloat16).page_size_bytes
    pages = {size for group in ours["kv_groups"] for size in group["layers"].values()}
    assert pages == {bf16 // 2} and bf16 == 2 * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * 2, (pages, bf16)


def test_c8_on_the_npu_kernel_backend_runs_with_no_fallback(c8_runs):
    """torch_npu's C8 path: npu_quantize then the ATB cache write; FIA v2 over the int8 pages for decode steps
    (BNSD, per-channel dequant parameters), npu_anti_quant into scratch pages for prefill chunks."""
    npu, reference = c8_runs[("npu", "c8")], c8_runs[("v1", "c8")]
    assert npu["facts"]["kernel_backend"] == "npu"
    ran = {op for op, n in npu["npu_ops"].items() if n}
    assert {"npu_quantize", "_npu_reshape_and_cache", "npu_fused_infer_attention_score_v2", "npu_anti_quant"} <= ran
    assert npu["fallbacks"] == {}, npu["fallback_reasons"]
    assert {k for k, n in npu["counts"].items() if n > 0} >= C8_OPS
    check_logprobs_close(npu["outputs"], reference["outputs"], name_0="npu kernels", name_1="reference kernels")
