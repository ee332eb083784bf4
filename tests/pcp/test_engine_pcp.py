"""Prefill context parallel of 2 inside a real vLLM engine (simulated lane, Model Runner V2, two ranks on gloo).

Greedy tokens equal PCP=1's for prompts of 1, 31, 32, 33, 151 and 300 tokens, in one batch and one at a time, and
for the seed's 298 + 2 token step; both ranks ran the Ascend backend's PCP path (K/V all-gather into each rank's
replica, chunk attention merged by log-sum-exp for chunks that continue a context); the PCP manager's persistent
buffers never moved; unservable configurations stop at start-up naming why. Engines: see conftest.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


def _tokens(outputs) -> list[list[int]]:
    return [o["token_ids"] for o in outputs]


@pytest.mark.parametrize("phase", ["batch", "sequential", "seed"])
def test_pcp2_greedy_output_equals_pcp1(pcp_runs, phase):
    pcp2, pcp1 = pcp_runs["pcp2"], pcp_runs["pcp1"]
    assert all(len(t) == 8 for t in _tokens(pcp2[phase]))
    assert _tokens(pcp2[phase]) == _tokens(pcp1[phase])


def test_both_ranks_ran_the_ascend_pcp_path(pcp_runs):
    ranks = pcp_runs["pcp2"]["usage"]
    assert len(ranks) == 2
    for usage in ranks:
        counts, facts = usage["counts"], usage["facts"]
        assert usage["attention_impls"] == ["AscendAttentionImpl"] and facts["runner"] == "v2"
        assert facts["pcp_manager"] == "ascend_platform.pcp.manager.AscendPCPManager"
        # Every layer of every step all-gathered its K/V (the forward counts include graph replays).
        assert counts["pcp.kv_all_gather"] == counts["attention.ascend.forward"] > 0
        assert counts["pcp.attention.chunks"] > 0 and counts["kernels.attention_with_lse"] > 0
        # Chunked prefill (300 tokens past the 512 budget) and prefix-cache hits continue a context: merged.
        assert counts["pcp.attention.merged_chunks"] > 0
        for op in ("kernels.paged_attention_with_lse", "kernels.merge_attention_states"):
            assert counts[op] > 0, op
    assert pcp_runs["pcp1"]["pcp"] == [{"manager": None}]


def test_pcp_buffers_keep_their_addresses_across_steps(pcp_runs):
    for state in pcp_runs["pcp2"]["pcp"]:
        assert state["manager"] == "ascend_platform.pcp.manager.AscendPCPManager" and state["world"] == 2
        assert state["runner_reads_its_buffers"]
        assert state["addresses"] == state["initial_addresses"]
        assert len(state["steps"]) >= 20
        assert all(step["buffers_in_place"] for step in state["steps"])
    assert sorted(s["rank"] for s in pcp_runs["pcp2"]["pcp"]) == [0, 1]


def test_seed_regression_151_real_tokens_beside_a_76_token_graph(pcp_runs, pcp_settings):
    # The step with the 298 + 2 token prefills: rank 1 holds 151 real tokens; the largest graph holds 76.
    assert max(pcp_settings["capture_sizes"]) == 76
    for state in pcp_runs["pcp2"]["pcp"]:
        seed_steps = [s for s in state["steps"] if sum(s["real_tokens_per_rank"]) == sum(pcp_settings["seed_lengths"])]
        assert len(seed_steps) == 1, state["steps"]
        step = seed_steps[0]
        assert step["real_tokens_per_rank"] == [149, 151]
        assert step["local_tokens_after_padding"] == 151  # every real token kept, none padded away or cut
        assert step["descriptor_mode"] == "NONE" and step["descriptor_tokens"] is None  # eager past 76
        assert step["prefill_rows"] == 3  # head and tail chunk of the 298, one token of the 2
    assert _tokens(pcp_runs["pcp2"]["seed"]) == _tokens(pcp_runs["pcp1"]["seed"])


def test_configurations_pcp_cannot_serve_fail_at_startup_naming_why(pcp_runs):
    refusals = pcp_runs["refusals"]
    mla, window = refusals["mla"], refusals["sliding_window"]
    assert mla is not None and window is not None
    assert "prefill context parallel" in mla["message"] and "MLA model" in mla["message"]
    assert "ASCEND_MLA" in mla["message"]
    assert "sliding-window attention (sliding_window=64)" in window["message"]
