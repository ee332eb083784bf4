"""EAGLE-3 speculative decoding run in engines of the simulated lane, on both runners, lossless for greedy decoding.

The draft is a tiny random EAGLE-3 checkpoint in the layout vLLM 0.32's ``llama_eagle3`` model loads
(`ascend_testkit.models.eagle3`: one decoder layer over ``[embedding; fc(three target states)]``, a truncated
draft vocabulary mapped into the target's by ``d2t``), on the EAGLE-compatible tiny Llama the other EAGLE tests use.
The target hands the draft its hidden states at the layers the draft's config names. On V1 vLLM's EAGLE proposer
drafts and `AscendRejectionSampler` verifies; on Model Runner V2 `AscendEagleSpeculator` drafts and
`AscendMRV2RejectionSampler` verifies. Each engine's greedy tokens must equal the same runner's without
speculation (the baselines the EAGLE suites of each runner already run, shared through conftest), drafts must have
been verified (a random draft is mostly rejected), and the classes that ran must be ours.
"""

from __future__ import annotations

import pytest

from ascend_specdecode.metrics import AcceptanceReport

pytestmark = pytest.mark.engine

K = 3
VERIFIERS = {
    "v1": "ascend_specdecode.verification.AscendRejectionSampler",
    "mrv2": "ascend_specdecode.mrv2_verification.AscendMRV2RejectionSampler",
}
MRV2_SPECULATOR = "ascend_specdecode.speculators.autoregressive.AscendEagleSpeculator"
DRAFT_MODEL = "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM"


@pytest.fixture(scope="module")
def eagle3_draft(draft_models, specdecode_cache) -> str:
    from pathlib import Path

    from ascend_testkit.models.eagle3 import eagle3_draft as build

    target = Path(draft_models["target"])
    return str(build(target, specdecode_cache / f"{target.name}-eagle3-rand"))


@pytest.fixture(scope="module")
def runs(
    run_case, run_mrv2, sim_v1_host, sim_host, eagle3_draft, workload, mrv2_workload, engine_kwargs, draft_models
) -> dict:
    """Per runner: (baseline, EAGLE-3) results of `ascend_testkit.speculation.measure` on the same prompts."""
    from ascend_testkit.speculation import measure

    spec = {"method": "eagle3", "model": eagle3_draft, "num_speculative_tokens": K}
    target = draft_models["target"]
    v1 = measure(sim_v1_host, target, spec, workload["prompts"], workload["max_tokens"], **engine_kwargs)
    mrv2 = measure(
        sim_host, target, spec, mrv2_workload["prompts"], mrv2_workload["max_tokens"], sequential=False, **engine_kwargs
    )
    return {
        "v1": (run_case("simulated-npu", "baseline"), v1),
        "mrv2": (run_mrv2("baseline-llama"), mrv2),
    }


@pytest.mark.parametrize("runner", sorted(VERIFIERS))
def test_eagle3_is_lossless(runs, runner):
    baseline, eagle3 = runs[runner]
    assert baseline["token_ids"] and all(baseline["token_ids"]), baseline
    assert eagle3["token_ids"] == baseline["token_ids"], f"EAGLE-3 on {runner} changed greedy output"


@pytest.mark.parametrize("runner", sorted(VERIFIERS))
def test_eagle3_drafts_are_verified(runs, runner):
    report = AcceptanceReport.from_dict(runs[runner][1]["acceptance"])
    assert report.num_drafts > 0, f"{runner}: no EAGLE-3 drafts were verified"
    assert len(report.accepted_per_position) == K
    assert report.acceptance_per_position[0] < 0.5, report.as_dict()  # a random draft: mostly rejected


@pytest.mark.parametrize("runner", sorted(VERIFIERS))
def test_eagle3_ran_through_our_parts(runs, runner):
    usage = runs[runner][1]["usage"][0]
    assert usage["verifier"] == VERIFIERS[runner], usage
    assert usage["verifier_counts"].get("greedy_verifications", 0) > 0, usage
    assert usage["draft_model"] == DRAFT_MODEL, usage
    if runner == "mrv2":
        assert usage["speculator"] == MRV2_SPECULATOR, usage
