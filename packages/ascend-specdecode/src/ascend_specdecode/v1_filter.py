"""The V1-only unsupported-feature filter (reference: patch_use_v2_model_runner after vLLM PR 53183).

Upstream's `VllmConfig._get_v1_model_runner_unsupported_features()` lists what the V1 runner cannot run. The Ascend
V1 runner does run DSpark and DFlash2 drafts, so exactly those two entries are removed; every other entry (prefill
context parallel, adaptive verification, LiLiCorr candidate heads, ...) stays.
"""

from __future__ import annotations

from collections.abc import Iterable

DSPARK_FEATURE = "dspark speculative decoding"
# Upstream names DFlash2 and LiLiCorr drafts alike; only a DFlash2 draft is ours to allow.
CANDIDATE_HEAD_FEATURE = "DFlash candidate-head drafts"
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"


def v1_unsupported_filter(features: Iterable[str], draft_architectures: Iterable[str] = ()) -> list[str]:
    """`features` without DSpark, and without the candidate-head entry when the draft is DFlash2 (order kept)."""
    archs = set(draft_architectures)
    drop = {DSPARK_FEATURE}
    if DFLASH2_ARCHITECTURE in archs and archs <= {DFLASH2_ARCHITECTURE}:
        drop.add(CANDIDATE_HEAD_FEATURE)
    return [f for f in features if f not in drop]


def filtered_v1_unsupported_features(vllm_config) -> list[str]:
    """Upstream's V1-unsupported list for `vllm_config`, filtered (the body of the platform's patch)."""
    from ascend_specdecode.methods import draft_architectures

    features = vllm_config._get_v1_model_runner_unsupported_features()
    return v1_unsupported_filter(features, draft_architectures(vllm_config.speculative_config))
