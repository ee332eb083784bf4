"""`ascend_kernels`' torch_npu bindings in real vLLM engines (simulated lane, the testkit's schema-faithful torch_npu):
the same outputs as the reference kernels, every hot torch_npu op called, nothing falling back.

See the conftest for the engines. The fake registers each op with the 2.13.0 wheel's schema, so a binding passing a
keyword or type the real torch_npu would refuse fails the engine here; `test_a_renamed_schema_keyword_stops_the_engine`
shows that this engine path is schema-checked (not only the unit tests of the bindings).
"""

from __future__ import annotations

import collections

import pytest

pytestmark = pytest.mark.engine

# Every model on both runners with the NPU backend.
MODELS = ("llama", "deepseek_v2", "deepseek_v32", "qwen3_moe")
RUNS = tuple((model, runner) for model in MODELS for runner in ("v1", "v2"))
# The reference-kernel engine each model's NPU runs are held to: the Llama's own runner (both runners' samplers are
# checked on the reference kernels too), one runner for the others. The runners schedule the same steps (same
# scheduler, budget and prompts) and compute the same logits; sharing one reference engine per model keeps the suite
# within its time (an engine start is most of a run here).
REFERENCE_RUNNER = {"deepseek_v2": "v2", "deepseek_v32": "v1", "qwen3_moe": "v1"}

# What each model's generation must run on torch_npu (name as the bindings count it: the torch_npu attribute).
CACHE_WRITE = {"_npu_reshape_and_cache"}
NORMS = {"npu_rms_norm", "npu_add_rms_norm"}
ROTARY = {"_npu_rotary_embedding"}
GQA_ATTENTION = {"npu_fused_infer_attention_score_v2"}
MLA_ATTENTION = {"npu_fused_infer_attention_score", "npu_paged_cache_load"}
MOE = {"npu_moe_gating_top_k", "npu_moe_init_routing_v2", "npu_grouped_matmul", "npu_swiglu",
       "npu_moe_token_unpermute"}
SAMPLING_FILTER = {"npu_top_k_top_p"}  # the Llama runs also sample with top_k / top_p (conftest SAMPLED)
HOT_OPS = {
    "llama": CACHE_WRITE | NORMS | ROTARY | GQA_ATTENTION | SAMPLING_FILTER | {"npu_swiglu"},
    "deepseek_v2": CACHE_WRITE | NORMS | ROTARY | MLA_ATTENTION | {"npu_swiglu"},
    "deepseek_v32": CACHE_WRITE | NORMS | ROTARY | {"npu_swiglu"},
    "qwen3_moe": CACHE_WRITE | NORMS | ROTARY | GQA_ATTENTION | MOE,
}


@pytest.mark.parametrize(("model", "runner"), RUNS, ids=[f"{m}-{r}" for m, r in RUNS])
def test_npu_kernels_match_the_reference_kernels(npu_runs, logprobs_close, model, runner):
    reference_runner = REFERENCE_RUNNER.get(model, runner)
    npu, reference = npu_runs[(model, runner, "npu")], npu_runs[(model, reference_runner, "auto")]
    assert npu["facts"]["kernel_backend"] == "npu" and npu["facts"]["runner"] == runner
    assert reference["facts"]["runner"] == reference_runner
    # 'auto' stays the reference kernels in the simulated lane, even with a torch_npu in the process.
    assert reference["facts"]["kernel_backend"] == "reference" and not reference["npu_ops"]
    assert all(len(o["token_ids"]) > 0 for o in npu["outputs"])
    logprobs_close(npu["outputs"], reference["outputs"], name_0="npu kernels", name_1="reference kernels")


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_both_runners_sample_through_the_facades_filter(npu_runs, runner):
    """vLLM's top-k / top-p filter runs as `ascend_kernels`' top_k_top_p on either backend: V1 without Triton
    (patched torch route), MRV2 through vLLM's kernel dispatcher; npu_top_k_top_p on the NPU backend."""
    for backend in ("npu", "auto"):
        run = npu_runs[("llama", runner, backend)]
        assert run["counts"].get("kernels.top_k_top_p", 0) > 0, (backend, run["counts"])
        assert [len(o["token_ids"]) for o in run["sampled"]] == [6] * len(run["sampled"])
    assert npu_runs[("llama", runner, "npu")]["npu_ops"].get("npu_top_k_top_p", 0) > 0


@pytest.mark.parametrize(("model", "runner"), RUNS, ids=[f"{m}-{r}" for m, r in RUNS])
def test_every_hot_torch_npu_op_ran_and_nothing_fell_back(npu_runs, model, runner):
    npu = npu_runs[(model, runner, "npu")]
    missing = sorted(op for op in HOT_OPS[model] if npu["npu_ops"].get(op, 0) == 0)
    assert not missing, f"{model} on {runner}: torch_npu ops that never ran: {missing} (ran: {npu['npu_ops']})"
    assert npu["fallbacks"] == {}, f"{model} on {runner} fell back: {npu['fallbacks']} ({npu['fallback_reasons']})"
    # Every call the bindings counted reached the fake's schema-registered op (none bypassed the dispatcher); the
    # fake counts per overload (`npu_paged_cache_load.out`), the bindings per op.
    reached = collections.Counter()
    for key, n in npu["fake_calls"].items():
        reached[key.split(".")[0]] += n
    assert {op: n for op, n in reached.items() if n} == npu["npu_ops"]


PLANTED = ("npu_fused_infer_attention_score_v2", "softmax_scale", "scale")


def test_a_renamed_schema_keyword_stops_the_engine(npu_hosts, npu_engine, npu_models, npu_prompts, tmp_path_factory):
    """A torch_npu whose paged-attention kernel calls `softmax_scale` `scale` (as a release renaming it would): the
    engine's first attention call fails in the dispatcher, naming the keyword, instead of running on."""
    from ascend_testkit.engine import EngineError
    from ascend_testkit.planted_torch_npu import planted_wheel_tree
    from ascend_testkit.torch_npu import WHEEL_ENV

    op, keyword, renamed = PLANTED
    tree = planted_wheel_tree(tmp_path_factory.mktemp("planted-torch-npu"), op, keyword, renamed)
    host = npu_hosts("v1", name="npu-planted", env={WHEEL_ENV: str(tree)})
    try:
        with pytest.raises(EngineError) as failed:
            host.start(npu_models["llama"], **(npu_engine | {"additional_config": {"kernel_backend": "npu"}}))
            host.generate(npu_prompts[:1], max_tokens=2)
    finally:
        host.close()
    assert f"Unknown keyword argument '{keyword}' for operator 'npu::{op}'" in str(failed.value)


def test_npu_kernels_without_a_torch_npu_stop_start_up_with_the_reason(sim_v1_host, npu_models):
    """The simulated lane's own host has no torch_npu: `kernel_backend="npu"` is refused before any worker starts."""
    error = sim_v1_host.start_error(npu_models["llama"], dtype="bfloat16", max_model_len=256, enforce_eager=True,
                                    additional_config={"kernel_backend": "npu"})
    assert error is not None and error["type"] == "AscendConfigError", error
    assert "bad value 'npu' for key 'kernel_backend'" in error["message"]
    assert "torch_npu is not installed" in error["message"]
