"""Speculative decoding on Model Runner V2 in the simulated-NPU lane, every method through the Ascend speculators.

Each method (EAGLE, MTP, DFlash, DFlash2, DSpark) runs in a real vLLM engine on the simulated lane's default runner,
drafting with `ascend_specdecode`'s speculator and verifying with `AscendMRV2RejectionSampler` (greedy decisions by
`ascend_kernels`), on one batch of mixed prompt lengths around the 32-token KV block boundary. Its greedy output must
equal its target's output without speculation. Where a draft can reproduce the target (`ascend_testkit.speculation`
and the README say how for each method), acceptance must hold 0.99 at every draft position; a noisy copy of that
draft must be accepted in part (drafts accepted, then a rejection, within one step), which is what exercises the
runner's rollback of rejected tokens; DFlash, which no draft can match, runs a random draft.
"""

from __future__ import annotations

import pytest

from ascend_specdecode.metrics import AcceptanceReport
from ascend_testkit.speculation import CASES_BY_NAME, MRV2_CASES, baseline_of

pytestmark = pytest.mark.engine

K = 3
SELF_DRAFT_FLOOR = 0.99
SPECULATIVE = [c.name for c in MRV2_CASES if c.family is not None]
SELF_DRAFTS = [c.name for c in MRV2_CASES if c.draft == "self"]
NOISY_DRAFTS = [c.name for c in MRV2_CASES if c.draft == "noisy"]
SPECULATORS = {
    "eagle": "ascend_specdecode.speculators.autoregressive.AscendEagleSpeculator",
    "mtp": "ascend_specdecode.speculators.autoregressive.AscendMTPSpeculator",
    "dflash": "ascend_specdecode.speculators.parallel.AscendDFlashSpeculator",
    "dflash2": "ascend_specdecode.speculators.parallel.AscendDFlash2Speculator",
    "dspark": "ascend_specdecode.speculators.parallel.AscendDSparkSpeculator",
}
VERIFIER = "ascend_specdecode.mrv2_verification.AscendMRV2RejectionSampler"
RUNNER = "ascend_platform.worker.model_runner_v2.SimulatedModelRunnerV2"


def report_of(result: dict) -> AcceptanceReport:
    return AcceptanceReport.from_dict(result["acceptance"])


def test_every_method_has_a_case():
    assert {c.family for c in MRV2_CASES} - {None} == set(SPECULATORS)
    assert {CASES_BY_NAME[name].family for name in SELF_DRAFTS} == {"eagle", "mtp", "dflash2", "dspark"}


@pytest.mark.parametrize("case", SPECULATIVE)
def test_speculation_is_lossless(run_mrv2, case):
    result = run_mrv2(case)
    baseline = run_mrv2(baseline_of(CASES_BY_NAME[case]).name)
    assert [len(t) for t in baseline["token_ids"]] == [28] * 4
    assert result["token_ids"] == baseline["token_ids"], f"{case}: speculation changed greedy output"
    assert report_of(result).num_drafts > 0, f"{case}: no drafts were verified"


@pytest.mark.parametrize("case", SELF_DRAFTS)
def test_self_draft_is_accepted_at_every_position(run_mrv2, case):
    report = report_of(run_mrv2(case))
    assert len(report.acceptance_per_position) == K
    report.check_floor(SELF_DRAFT_FLOOR, label=f"{case} on Model Runner V2")


@pytest.mark.parametrize("case", NOISY_DRAFTS)
def test_noisy_draft_is_accepted_in_part(run_mrv2, case):
    """Acceptance strictly between 0 and 1, and lower at later positions: steps accepted some drafts and rejected
    the rest (a metric stuck at 0 or 1 would fail here)."""
    rates = report_of(run_mrv2(case)).acceptance_per_position
    assert 0.05 < rates[0] < 0.95, rates
    assert rates[K - 1] < rates[0], rates


def test_random_dflash_draft_is_mostly_rejected(run_mrv2):
    report = report_of(run_mrv2("dflash-random"))
    assert report.num_drafts > 0 and report.acceptance_per_position[0] < 0.5, report.as_dict()


@pytest.mark.parametrize("case", SPECULATIVE)
def test_our_speculator_and_verifier_ran(run_mrv2, case):
    """Usage markers from the worker: our speculator proposed (forwarding vLLM 0.32's `dp_sync_state`), its draft
    metadata was built decode-only, and our verifier decided every greedy verification."""
    usage = run_mrv2(case)["usage"][0]
    family = CASES_BY_NAME[case].family
    assert usage["runner"] == RUNNER, usage
    assert usage["speculator"] == SPECULATORS[family], usage
    counts = usage["speculator_counts"]
    assert counts.get("propose", 0) > 0 and counts.get("dp:dp_sync_state=none", 0) >= counts["propose"], counts
    assert usage["verifier"] == VERIFIER, usage
    verified = usage["verifier_counts"]
    assert verified.get("greedy_verifications", 0) > 0 and verified.get("upstream_verifications", 0) == 0, verified


def test_dflash2_runs_as_dflash2_not_dflash1(run_mrv2, mrv2_models):
    """The DFlash2 self-draft's own lm_head is all zeros: DFlash1's path (sampling the mask slots' logits, what vLLM's
    V1 proposer runs for this checkpoint) would draft token 0 at every position. Only DFlash2's candidate walk, built
    through our model factories, reproduces the target."""
    from safetensors.torch import load_file

    result = run_mrv2("dflash2-self")
    usage = result["usage"][0]
    assert usage["speculator"] == SPECULATORS["dflash2"], usage
    assert usage["draft_model"] == "ascend_specdecode.models.dflash2.AscendDFlash2Qwen3ForCausalLM", usage
    assert usage["draft_layers"] == ["ascend_specdecode.models.dflash2.AscendDFlash2Qwen3DecoderLayer"], usage
    counts = usage["speculator_counts"]
    assert counts.get("candidate_walks", 0) > 0, usage
    # Greedy drafts score only the edge rows their walk reads (`speculators.candidate_walk`), not all top_k**2.
    assert counts.get("walked_rows_only") == counts["candidate_walks"] and not counts.get("full_edge_walks"), usage
    head = load_file(f"{mrv2_models['dflash2-self']['spec']['model']}/model.safetensors")["lm_head.weight"]
    assert not head.any(), "the DFlash2 self-draft must carry an all-zero lm_head"
    zeros = sum(t.count(0) for t in result["token_ids"]) / sum(len(t) for t in result["token_ids"])
    assert zeros < 0.05, "token 0 is common in the target's output: the contrast with DFlash1 proves nothing"
    report_of(result).check_floor(SELF_DRAFT_FLOOR, label="DFlash2 self-draft")


def test_dspark_samples_its_blocks_through_the_markov_head(run_mrv2):
    usage = run_mrv2("dspark-self")["usage"][0]
    assert usage["speculator_counts"].get("markov_blocks", 0) > 0, usage
