"""A DeepSeek-V2 MLA model end to end in the simulated-NPU lane (ASCEND_MLA over ascend_kernels), against vLLM's
own CPU MLA engine and against transformers' float64 forward pass (see conftest for the engines and why)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engine]


def test_mla_matches_vllm_cpu_mla(mla_runs, mla_settings, logprobs_close):
    ours, cpu = mla_runs["ascend"], mla_runs["cpu"]
    assert cpu["platform"] == "CpuPlatform" and ours["platform"] == "SimulatedNPUPlatform"
    assert all(len(o["token_ids"]) == mla_settings["max_tokens"] for o in ours["outputs"])
    logprobs_close(ours["outputs"], cpu["outputs"], name_1="vLLM CPU_MLA")


def test_mla_on_model_runner_v2_matches_vllm_cpu_mla(mla_runs, logprobs_close):
    ours = mla_runs["ascend_v2"]
    assert ours["usage"]["facts"]["runner"] == "v2" and ours["usage"]["attention_impls"] == ["AscendMLAImpl"]
    assert ours["usage"]["counts"]["attention.ascend_mla.context_prefills"] > 0  # chunked prefill on MRV2 too
    logprobs_close(ours["outputs"], mla_runs["cpu"]["outputs"], name_1="vLLM CPU_MLA")


def test_mla_matches_transformers_in_float64(mla_runs, logprobs_close):
    logprobs_close(mla_runs["ascend"]["outputs"], mla_runs["float64"]["outputs"], name_1="transformers float64")


def test_prefix_cache_hits_continue_the_cached_latent_and_give_the_same_tokens(mla_runs):
    ours = mla_runs["ascend"]
    assert [o["token_ids"] for o in ours["outputs_again"]] == [o["token_ids"] for o in ours["outputs"]]
    # Every prompt of at least one full block is found in the prefix cache and prefilled on top of it.
    assert ours["context_prefills_again"] >= 1


def test_ascend_mla_backend_and_kernels_did_the_work(mla_runs, mla_settings):
    usage = mla_runs["ascend"]["usage"]
    counts, facts = usage["counts"], usage["facts"]
    assert usage["attention_impls"] == ["AscendMLAImpl"] and facts["attention_backend"] == "ASCEND_MLA"
    assert facts["kernel_backend"] == "reference" and facts["kernel_checks"] is True
    for op in ("kernels.reshape_and_cache_mla", "kernels.mla_decode_attention", "kernels.mla_prefill_attention",
               "kernels.gather_mla_cache"):
        assert counts.get(op, 0) > 0, (op, counts)
    # Chunked prefill: the 33- and 100-token prompts arrive in 32-token chunks that continue their cached context,
    # and decodes of the short prompts share steps with those chunks.
    assert counts["attention.ascend_mla.context_prefills"] > 0
    assert counts["attention.ascend_mla.mixed_batches"] > 0
    # Both layers saw every prompt token in prefill.
    assert counts["attention.ascend_mla.prefill_tokens"] >= 2 * sum(mla_settings["prompt_lengths"])
    assert counts["attention.ascend_mla.decode_tokens"] > 0


def test_kv_bytes_per_token_per_layer_is_the_latent(mla_runs, mla_settings):
    ours = mla_runs["ascend"]
    layers = ours["layer_kv"]
    assert len(layers) == 2
    for name, kv in layers.items():
        assert kv["kind"] == "MLAKV" and kv["dims"] == {"latent": 512, "rope": 64}, (name, kv)
        assert kv["bytes_per_token"] == kv["vllm_view_bytes_per_token"] == 576 * 4  # float32 latent + rope, no V
        assert kv["states_per_block"] == mla_settings["block_size"]
    assert set(ours["kv_specs"].values()) == {"ascend_core.kv.specs.AscendMLAAttentionSpec"}


def test_unsupported_kv_cache_dtype_fails_startup_naming_why(mla_runs):
    err = mla_runs["refusal"]["fp8"]
    assert err is not None, "an fp8 KV cache should be refused"
    assert "ASCEND_MLA" in err["message"] and "kv_cache_dtype 'fp8'" in err["message"], err["message"]
