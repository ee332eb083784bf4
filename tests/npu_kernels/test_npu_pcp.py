"""Prefill context parallel of 2 on the NPU kernel backend (MRV2, the testkit's schema-faithful torch_npu): the
context-parallel bindings (`attention_with_lse`, `paged_attention_with_lse`, `merge_attention_states`) run inside a
real engine on what PCP hands them on a card (bfloat16, 128-token blocks, a query split from the fused qkv
projection, keys and values cut from the all-gathered K|V rows), every call reaching torch_npu, none falling back.

The engine is the Llama of the NPU-kernel suite with its prompts and engine arguments (conftest), so its PCP=1 twin is
the suite's reference-kernel Llama on MRV2, which runs anyway: the two must agree under `check_logprobs_close`.
"""

from __future__ import annotations

import collections

import pytest

pytestmark = pytest.mark.engine

PCP2 = ("llama", "v2", "npu", 2)
# The context-parallel parts of a prefill chunk (FIA with softmax_lse_flag for the step's keys and for the paged
# context; npu_attention_update merges them), beside the ops every Llama step runs (decode rows read the replica
# through FIA v2; the gathered K/V of every rank is written into each rank's replica).
PCP_OPS = {"npu_fused_infer_attention_score", "npu_attention_update"}
STEP_OPS = {"npu_fused_infer_attention_score_v2", "_npu_reshape_and_cache", "npu_rms_norm", "npu_add_rms_norm",
            "_npu_rotary_embedding", "npu_swiglu"}


def test_pcp2_on_npu_kernels_matches_pcp1_on_reference_kernels(npu_runs, logprobs_close):
    pcp2, pcp1 = npu_runs[PCP2], npu_runs[("llama", "v2", "auto")]
    assert pcp1["facts"]["kernel_backend"] == "reference" and pcp1["facts"].get("pcp_manager") is None
    assert [len(o["token_ids"]) for o in pcp2["outputs"]] == [len(o["token_ids"]) for o in pcp1["outputs"]]
    logprobs_close(pcp2["outputs"], pcp1["outputs"], name_0="PCP=2 npu kernels", name_1="PCP=1 reference kernels")


def test_both_ranks_ran_the_pcp_path_on_torch_npu(npu_runs):
    ranks = npu_runs[PCP2]["ranks"]
    assert len(ranks) == 2
    for rank in ranks:
        facts, counts, npu_ops = rank["facts"], rank["counts"], rank["npu_ops"]
        assert facts["kernel_backend"] == "npu" and facts["runner"] == "v2"
        assert facts["pcp_manager"] == "ascend_platform.pcp.manager.AscendPCPManager"
        # Chunks that continue a context (the 64-token budget cuts every long prompt) attend in two parts, merged.
        assert counts["pcp.attention.merged_chunks"] > 0
        lse_calls = counts["kernels.attention_with_lse"] + counts["kernels.paged_attention_with_lse"]
        assert counts["kernels.paged_attention_with_lse"] > 0 and counts["kernels.merge_attention_states"] > 0
        # Every call of the three ops ran its torch_npu kernel (FIA v1 serves only them in a Llama).
        assert npu_ops["npu_fused_infer_attention_score"] == lse_calls, (npu_ops, counts)
        assert npu_ops["npu_attention_update"] == counts["kernels.merge_attention_states"], (npu_ops, counts)
        missing = sorted(op for op in PCP_OPS | STEP_OPS if npu_ops.get(op, 0) == 0)
        assert not missing, f"rank {ranks.index(rank)}: torch_npu ops that never ran: {missing} (ran: {npu_ops})"
        assert rank["fallbacks"] == {}, f"PCP fell back: {rank['fallbacks']} ({rank['fallback_reasons']})"
        reached = collections.Counter()
        for key, n in rank["fake_calls"].items():
            reached[key.split(".")[0]] += n
        assert {op: n for op, n in reached.items() if n} == npu_ops
