"""Model Runner V2 (vLLM's default) in the simulated-NPU lane against plain vLLM CPU (V1, no plugin).

The same prompts as the V1 suite (ending before, on and after 32-token block edges; 70 and 100 tokens are prefilled
in chunks under the 64-token budget while the short ones decode, so steps mix prefills and decodes), for the tiny
Llama and a grouped-query-attention variant. vLLM's CPU build cannot run MRV2 at all (no Triton backend); in our
lane it runs on Triton's interpreter with the per-step kernels replaced by torch / `ascend_kernels` stand-ins.
"""

from __future__ import annotations

import pytest

from ascend_core.upstream import mrv2_unavailable_reason

# Where the installed vLLM lacks what Ascend's MRV2 needs (the legacy lane), start-up refuses MRV2 by probe:
# tests/platform/test_release_lane.py checks that refusal; nothing here can run.
_REFUSED = mrv2_unavailable_reason()
pytestmark = [pytest.mark.engine, pytest.mark.skipif(
    _REFUSED is not None, reason=f"Model Runner V2 refused by probe mrv2_kv_hooks: {_REFUSED}"),
    pytest.mark.usefixtures("sim_host")]  # the MRV2 host platform_runs uses for these runs (only these)

RUNNER_V2 = "ascend_platform.worker.model_runner_v2.SimulatedModelRunnerV2"


def test_mrv2_greedy_matches_vllm_cpu(platform_runs, logprobs_close):
    ours, cpu = platform_runs["ascend_v2"], platform_runs["cpu"]
    assert ours["runner"] == "default"  # vLLM chose MRV2 itself: nobody set VLLM_USE_V2_MODEL_RUNNER
    assert ours["usage"]["facts"]["runner"] == "v2" and ours["usage"]["facts"]["runner_class"] == RUNNER_V2
    assert all(len(o["token_ids"]) == 24 for o in ours["outputs"])
    logprobs_close(ours["outputs"], cpu["outputs"])


def test_mrv2_gqa_matches_vllm_cpu(platform_runs, logprobs_close):
    ours, cpu = platform_runs["ascend_v2_gqa"], platform_runs["cpu_gqa"]
    assert ours["usage"]["facts"]["runner_class"] == RUNNER_V2
    assert [len(o["token_ids"]) for o in ours["outputs"]] == [24] * 5
    logprobs_close(ours["outputs"], cpu["outputs"])


def test_mrv2_ran_our_allocator_backend_kernels_and_stand_ins(platform_runs):
    run = platform_runs["ascend_v2"]
    usage, ran = run["usage"], run["ran"]
    assert usage["attention_impls"] == ["AscendAttentionImpl"]
    assert usage["facts"]["allocator"] == "ascend_core.kv.allocator.allocate_kv_caches"
    assert usage["counts"]["allocator.shared"] >= 1 and usage["facts"]["kernel_checks"] is True
    assert usage["facts"]["kv_cache_layout"] == "LBNHC" and usage["facts"]["attention.ascend.bound_layers"] == 2
    assert "attention.ascend.seq_lens_read_back" not in ran  # host lengths from vLLM's host copies, once per step
    for op in ("kernels.paged_attention", "kernels.reshape_and_cache", "kernels.rms_norm", "kernels.rotary_embedding",
               # MRV2's per-step Triton kernels, answered by our stand-ins instead of the interpreter
               "mrv2_kernels.prepare_pos_seq_lens", "mrv2_kernels.prepare_prefill_inputs", "mrv2_kernels.post_update",
               "mrv2_kernels.gumbel_sample", "mrv2_kernels.topk_log_softmax", "mrv2_kernels.gather_block_tables",
               # the per-step ones on their host paths (the first four and the gather counted only when the native
               # loop took the launch, gumbel_sample's bookkeeping numpy): the simulated lane's tensors are CPU tensors
               "mrv2_kernels.host.prepare_pos_seq_lens", "mrv2_kernels.host.combine_sampled_and_draft_tokens",
               "mrv2_kernels.host.get_num_sampled_and_rejected", "mrv2_kernels.host.post_update",
               "mrv2_kernels.host.gumbel_sample", "mrv2_kernels.host.gather_block_tables",
               # greedy requests: their sampling launches on the native argmax loop
               "mrv2_kernels.host.gumbel_greedy",
               # decode steps that added no request copy no sampling table (worker.sampler_staging)
               "mrv2.sampler_flush_skipped"):
        assert ran.get(op, 0) > 0, (op, ran)


def test_mrv2_sleep_levels_1_and_2_leave_generation_unchanged(platform_runs):
    run = platform_runs["ascend_v2"]
    tokens = [o["token_ids"] for o in run["outputs"]]
    for level in (1, 2):
        asleep, awake = run[f"sleep{level}"]["asleep"], run[f"sleep{level}"]["awake"]
        assert asleep["sleeping"] == ["kv_cache", "weights"] and asleep["level"] == level, asleep
        assert asleep["weights_numel"] == 0 and asleep["kv_bound"] is False
        assert awake["sleeping"] == [] and awake["kv_bound"] is True
        assert awake["weights_numel"] == run["usage"]["sleep"]["weights_numel"] > 0
        assert [o["token_ids"] for o in run[f"sleep{level}"]["outputs"]] == tokens, level


def test_mrv2_requested_where_it_cannot_run_is_one_named_error(tmp_path, tiny_model):
    """MRV2 asked for (VLLM_USE_V2_MODEL_RUNNER=1) on a machine without Triton: one start-up error naming what is
    missing, never a silent fall-back to V1."""
    from ascend_testkit.engine import EngineHost

    with EngineHost("mrv2-without-triton", lane="simulated", runner="v2", log_dir=tmp_path,
                    setup=["ascend_testkit.engine.shims:without_triton"]) as host:
        err = host.start_error(str(tiny_model), dtype="float32", max_model_len=256, enforce_eager=True)
    assert err is not None, "MRV2 started without Triton"
    # Raised in the platform's config hook; vLLM's pydantic config reports it as its "Value error".
    assert "Model Runner V2 was requested (VLLM_USE_V2_MODEL_RUNNER='1')" in err["message"], err
    assert "the 'triton' package is not installed" in err["message"], err
    assert "requires Triton" not in err["message"], err  # ours comes before vLLM's own, vaguer refusal
