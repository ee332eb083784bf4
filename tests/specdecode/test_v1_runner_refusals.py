"""The V1 runner refuses the methods it would run wrongly, at start-up.

The Ascend platform runs vLLM's own V1 model runner (with the Ascend verifier): vLLM's V1 has no DSpark proposer,
and it drafts a DFlash2 checkpoint with `DFlashProposer`, i.e. as DFlash1, without the candidate head. vLLM refuses
both on V1 (`VllmConfig._get_v1_model_runner_unsupported_features`); the reference plugin filters those entries out
because its own V1 runner has DSpark and DFlash2 proposers, ours does not, so this plugin keeps vLLM's refusal. An
engine that accepted either here would serve the method wrongly: the test fails if one starts.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine

REFUSED = {"dflash2-self": "DFlash candidate-head drafts", "dspark-self": "dspark speculative decoding"}


@pytest.mark.parametrize(("case", "feature"), sorted(REFUSED.items()))
def test_v1_engine_refuses(sim_v1_host, mrv2_models, engine_kwargs, case, feature):
    m = mrv2_models[case]
    error = sim_v1_host.start_error(m["model"], speculative_config=m["spec"], **engine_kwargs, **m["engine"])
    assert error is not None, f"the V1 runner started an engine for {case}, which it would not run as {case}"
    assert f"Model Runner V1 does not support: {feature}" in error["message"], error
