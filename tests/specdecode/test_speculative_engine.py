"""Speculative decoding in a real vLLM engine: a draft equal to the target is always accepted, any draft is lossless.

The target is a tiny random Llama with peaked output distributions (greedy choices are not decided by rounding),
made EAGLE-compatible (draft_checkpoints). Floors are per draft position, vLLM's convention (accepted at position i
over all drafts), so a drop at any single position fails the test by name.
"""

from __future__ import annotations

import pytest

from ascend_specdecode.metrics import AcceptanceReport

pytestmark = pytest.mark.engine

SELF_DRAFT_FLOOR = 0.99
# Methods whose draft can carry exactly the target's computation (see the report for the others).
SELF_DRAFT_METHODS = ["draft_model", "eagle"]
RANDOM_DRAFT_METHODS = ["draft_model", "eagle", "dflash"]


def report_of(result: dict) -> AcceptanceReport:
    return AcceptanceReport.from_dict(result["acceptance"])


@pytest.fixture(scope="module")
def baseline(run_case, workload):
    result = run_case(None)
    assert [len(t) for t in result["token_ids"]] == [workload["max_tokens"]] * len(workload["prompts"])
    return result


@pytest.mark.parametrize("method", SELF_DRAFT_METHODS)
def test_self_draft_is_accepted_at_every_position(run_case, baseline, workload, method):
    result = run_case(method, "self")
    report = report_of(result)
    assert len(report.acceptance_per_position) == workload["k"]
    report.check_floor(SELF_DRAFT_FLOOR, label=f"{method} self-draft, {workload['lane']} lane")
    assert result["token_ids"] == baseline["token_ids"]


@pytest.mark.parametrize("method", RANDOM_DRAFT_METHODS)
def test_random_draft_is_lossless(run_case, baseline, method):
    result = run_case(method, "random")
    report = report_of(result)
    assert report.num_drafts > 0, f"{method}: no drafts were verified"
    # A random draft must be mostly rejected: acceptance that stays high here would mean the metric lies.
    assert report.acceptance_per_position[0] < 0.5, report.as_dict()
    assert result["token_ids"] == baseline["token_ids"], f"{method}: speculation changed greedy output"


def test_drafts_are_verified_by_the_ascend_verifier(run_case, workload):
    """Our CPU-lane worker installs it; the simulated lane's platform must (install_speculative_decoding)."""
    parts = run_case("draft_model", "self")["parts"]
    ours = "ascend_specdecode.verification.AscendRejectionSampler"
    if workload["lane"] == "simulated-npu" and parts["verifier"] != ours:
        # Visible in every run's summary until ascend_platform's worker calls the hook; then this asserts.
        pytest.xfail(f"ascend_platform does not install the Ascend verifier yet: {parts}")
    assert parts["verifier"] == ours, (workload["lane"], parts)
