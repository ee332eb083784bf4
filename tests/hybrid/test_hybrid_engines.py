"""Gated delta-net hybrids (tiny Qwen3-Next, and tiny dense Qwen3.5 text models: linear-attention layers interleaved
with full attention) in the simulated-NPU lane on both model runners, against plain vLLM CPU on the same checkpoint.

Ours: the GDN layers' conv and recurrent states and the full-attention KV are one allocation of our allocator under
vLLM's hybrid cache groups (one page size across groups; the attention planes paged so they share bytes with the
states, `ascend_core.kv.planes`), the full-attention layers run our attention backend, and the GDN core runs the
kernel facade's conv / gated delta rule ops (`ascend_platform.models.qwen_gdn`). Prompts cross block edges, long
ones are prefilled in chunks (a chunk resumes from the stored conv and recurrent state), and a repeated prompt hits
the prefix cache (vLLM's "align" Mamba cache mode, which prefix caching turns on for hybrids).

The NPU kernel backend runs the same model too (V1 runner, over the testkit's torch_npu: the wheel's schemas and meta
functions, the ops as torch_npu's docs state them): its gated delta rule goes through torch_npu's chunk and
recurrent kernels (`ascend_kernels.npu_gdn`), with no fallback to the reference.

bf16 is what vLLM CPU's GDN layer takes, so the lanes are compared as vLLM's model tests compare them
(`check_logprobs_close`: equal tokens, or at the first divergence each side's token in the other's top 5).

Every engine host of this module runs `allow_image_only_processor` first (a `sitecustomize`, as the vision-language
tests do): vLLM 0.32's `qwen3_5.py` imports `qwen3_vl`, which imports a transformers image-processor module that
needs torchvision, absent here. It changes no engine code; the text models build no processor.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.counters import counter_delta
from ascend_testkit.models.hybrid import TinyHybridSpec, cached_tiny_qwen3_5, cached_tiny_qwen3_next
from ascend_testkit.models.word_tokenizer import prompt_of_length

pytestmark = [pytest.mark.engine]

# max_num_batched_tokens 96: prompts longer than that are prefilled in chunks.
ENGINE = {"dtype": "bfloat16", "max_model_len": 512, "enforce_eager": True, "max_num_seqs": 4,
          "max_num_batched_tokens": 96}
LENGTHS = (3, 41, 130, 290)
MAX_TOKENS = 10
LOGPROBS = 5
RUNNERS = {"v1": "SimulatedModelRunnerV1", None: "SimulatedModelRunnerV2"}
FAMILIES = {"qwen3_next": cached_tiny_qwen3_next, "qwen3_5": cached_tiny_qwen3_5}


@pytest.fixture(scope="module", params=list(FAMILIES))
def model_path(request, cache_root) -> str:
    return str(FAMILIES[request.param](cache_dir=cache_root / "models"))


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return [prompt_of_length(n, offset=3 * n) for n in LENGTHS]


FAKE_CALLS = "ascend_testkit.torch_npu_probes:fake_calls"


def run(host, model: str, prompts: list[str], usage: bool = True, kernel_backend: str | None = None) -> dict:
    """Greedy outputs of `prompts` (one batch), then the longest prompt again (a prefix-cache hit), from a fresh
    engine on `host`; in the simulated lane also the worker's usage deltas and its KV layout (and every kernel call's
    arguments checked against the facade's contracts); on the NPU kernel backend the fake torch_npu's op calls and
    the bindings' fallbacks too."""
    config = {"kernel_checks": True} | ({"kernel_backend": kernel_backend} if kernel_backend else {})
    host.start(model, **ENGINE, **({"additional_config": config} if usage else {}))
    try:
        before = host.usage()[0] if usage else {}
        calls = host.rpc(FAKE_CALLS)[0] if kernel_backend else {}
        out = host.generate(prompts, max_tokens=MAX_TOKENS, logprobs=LOGPROBS, ignore_eos=True)["outputs"]
        again = host.generate(prompts[-1:], max_tokens=MAX_TOKENS, logprobs=LOGPROBS, ignore_eos=True)["outputs"]
        result = {"outputs": out, "again": again[0],
                  "groups": host.rpc("ascend_testkit.kv_probes:kv_groups")[0]}
        if usage:
            after = host.usage()[0]
            result["delta"] = counter_delta(after["counts"], before["counts"])
            result["runner"] = after["facts"]["runner_class"]
            result["layers"] = host.rpc("ascend_testkit.kv_probes:hybrid_kv")[0]
            result["fallbacks"] = counter_delta(after["fallbacks"], before["fallbacks"])
            result["fallback_reasons"] = after["fallback_reasons"]
            result["paged_planes"] = counter_delta(after.get("paged_planes", {}), before.get("paged_planes", {}))
        if kernel_backend:
            result["fake_calls"] = counter_delta(host.rpc(FAKE_CALLS)[0], calls)
    finally:
        host.stop()
    return result


@pytest.fixture(scope="module")
def reference(image_only_host, model_path, prompts) -> dict:
    """Plain vLLM CPU (V1 runner, its own GDN and attention kernels)."""
    return run(image_only_host("hybrid-cpu", "cpu", "v1"), model_path, prompts, usage=False)


@pytest.fixture(scope="module", params=list(RUNNERS), ids=["v1", "mrv2"])
def ours(request, image_only_host, model_path, prompts) -> dict:
    runner = request.param
    result = run(image_only_host(f"hybrid-sim-{runner or 'default'}", "simulated", runner), model_path, prompts)
    result["expected_runner"] = RUNNERS[runner]
    return result


@pytest.fixture(scope="module")
def ours_npu(image_only_host, model_path, prompts) -> dict:
    """The NPU kernel backend over the testkit's torch_npu (installed in the engine's process by the testkit's vLLM
    plugin), V1 runner."""
    host = image_only_host("hybrid-npu-v1", "simulated", "v1", env={"ASCEND_TESTKIT_TORCH_NPU": "1"})
    return run(host, model_path, prompts, kernel_backend="npu")


def test_the_checkpoint_is_a_hybrid_whose_blocks_prompts_cross(reference):
    groups = {g["spec"]: g for g in reference["groups"]}
    assert set(groups) == {"FullAttentionSpec", "MambaSpec"}, reference["groups"]
    spec = TinyHybridSpec()
    assert len(groups["MambaSpec"]["layers"]) == spec.layer_types.count("linear_attention")
    assert len(groups["FullAttentionSpec"]["layers"]) == spec.layer_types.count("full_attention")
    # One page size across the groups (vLLM's hybrid alignment), and blocks the prompts cross.
    pages = {size for g in reference["groups"] for size in g["layers"].values()}
    assert len(pages) == 1, reference["groups"]
    block = groups["FullAttentionSpec"]["block_size"]
    assert max(LENGTHS) > 2 * block and any(n % block for n in LENGTHS), (block, LENGTHS)


def test_outputs_match_plain_vllm_cpu(ours, reference):
    assert ours["runner"].endswith(ours["expected_runner"]), ours["runner"]
    assert ours["groups"] == reference["groups"]
    check_logprobs_close(ours["outputs"], reference["outputs"], name_0="simulated NPU", name_1="vLLM CPU")


def test_gdn_layers_ran_the_kernel_facade_and_attention_our_backend(ours):
    delta = ours["delta"]
    spec = TinyHybridSpec()
    gdn_layers = spec.layer_types.count("linear_attention")
    prompt_tokens = sum(len(o["prompt_token_ids"]) for o in ours["outputs"])
    # Every prompt token of both requests batches through each GDN layer's prefill; the cache hit skips some.
    assert delta.get("gdn.prefill_tokens", 0) >= gdn_layers * prompt_tokens, delta
    assert delta.get("gdn.decode_tokens", 0) >= gdn_layers * (MAX_TOKENS - 1) * len(LENGTHS), delta
    # Chunked prefill: later chunks of the long prompts resume from the state the earlier chunk stored.
    assert delta.get("gdn.prefill_resumed", 0) > 0, delta
    assert delta.get("attention.ascend.forward", 0) > 0 and delta.get("kernels.paged_attention", 0) > 0, delta
    # vLLM hands blocks between the state and attention groups; new attention blocks were zeroed through our views.
    assert delta.get("allocator.zeroed_blocks", 0) > 0, delta


def test_states_and_attention_pages_share_one_allocation(ours):
    layers = ours["layers"]
    states = {n: v for n, v in layers.items() if v["kind"] == "MambaState"}
    attention = {n: v for n, v in layers.items() if v["kind"] == "AttentionKV"}
    assert len(states) == TinyHybridSpec().layer_types.count("linear_attention") and attention, layers
    assert len({v["storage"] for v in layers.values()}) == 1, layers
    # Each attention layer's planes are paged (its K and V inside each block's page, at the state layers' stride).
    stride = {s for v in states.values() for s in v["block_strides"]}
    for name, v in attention.items():
        assert v["paged_planes"], (name, v)
        assert set(v["block_strides"]) == stride, (name, v, stride)
    assert {v["start"] for v in attention.values()} & {v["start"] for v in states.values()}, layers


def test_a_repeated_prompt_hits_the_prefix_cache(ours, reference):
    for result in (ours, reference):
        assert result["again"]["num_cached_tokens"] > 0, result["again"]["num_cached_tokens"]
    assert ours["again"]["token_ids"] == ours["outputs"][-1]["token_ids"]
    check_logprobs_close([ours["again"]], [reference["again"]], name_0="simulated NPU", name_1="vLLM CPU")


def test_the_npu_backend_runs_torch_npus_gated_delta_rule_kernels(ours_npu, reference):
    check_logprobs_close(ours_npu["outputs"], reference["outputs"], name_0="NPU kernels", name_1="vLLM CPU")
    check_logprobs_close([ours_npu["again"]], [reference["again"]], name_0="NPU kernels", name_1="vLLM CPU")
    calls, delta, why = ours_npu["fake_calls"], ours_npu["delta"], ours_npu["fallback_reasons"]
    gdn_layers = TinyHybridSpec().layer_types.count("linear_attention")
    # Prefill chunks and decode steps each call the kernel once per GDN layer: decodes of 4 requests, 9 steps each.
    assert calls.get("npu_chunk_gated_delta_rule", 0) >= gdn_layers * 2, (calls, why)
    assert calls.get("npu_recurrent_gated_delta_rule", 0) >= gdn_layers * (MAX_TOKENS - 1), (calls, why)
    assert delta.get("gdn.prefill_resumed", 0) > 0, delta  # a chunk resumed from the kernel's stored state
    gdn_fallbacks = {op: n for op, n in ours_npu["fallbacks"].items() if "gated_delta_rule" in op}
    assert not gdn_fallbacks, (gdn_fallbacks, why)


def test_the_npu_backend_runs_the_full_attention_layers_on_fia_over_their_paged_planes(ours_npu):
    """A hybrid's attention K/V planes are paged beside the state pages (strided): the cache write indexes them in
    place and attention runs torch_npu's FIA on gathered blocks (`ascend_kernels.npu_paged_planes`), every step and
    layer, instead of the reference."""
    calls, planes, why = ours_npu["fake_calls"], ours_npu["paged_planes"], ours_npu["fallback_reasons"]
    attention_layers = TinyHybridSpec().layer_types.count("full_attention")
    attention_fallbacks = {op: n for op, n in ours_npu["fallbacks"].items()
                           if op in ("paged_attention", "reshape_and_cache")}
    assert not attention_fallbacks, (attention_fallbacks, why)
    steps = MAX_TOKENS  # at least: the prefill, then one call per decode step
    assert planes.get("paged_attention", 0) >= attention_layers * steps, planes
    assert planes.get("reshape_and_cache", 0) >= attention_layers * steps, planes
    assert calls.get("npu_fused_infer_attention_score_v2", 0) >= planes["paged_attention"], calls
    assert "_npu_reshape_and_cache" not in calls, calls  # the dense-cache kernel never saw a strided plane
