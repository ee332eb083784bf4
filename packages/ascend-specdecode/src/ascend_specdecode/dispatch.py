"""`select_speculator(speculative_config)`: the Ascend Model Runner V2 speculator class for a config.

Dispatch order dspark -> dflash (DFlash2 for a DFlash2 draft) -> mtp -> eagle, as the reference plugin does, then
ngram (drafts copied from the request's own tokens: its speculator reads the runner's request states); the classes are
imported lazily so that choosing one never imports the others' models.
"""

from __future__ import annotations

import importlib
from typing import Any

from ascend_specdecode.methods import DFLASH, DFLASH2, DRAFT_MODEL, DSPARK, EAGLE, MTP, NGRAM, speculator_family

SPECULATOR_CLASSES: dict[str, str] = {
    DSPARK: "ascend_specdecode.speculators.parallel:AscendDSparkSpeculator",
    DFLASH2: "ascend_specdecode.speculators.parallel:AscendDFlash2Speculator",
    DFLASH: "ascend_specdecode.speculators.parallel:AscendDFlashSpeculator",
    MTP: "ascend_specdecode.speculators.autoregressive:AscendMTPSpeculator",
    EAGLE: "ascend_specdecode.speculators.autoregressive:AscendEagleSpeculator",
    NGRAM: "ascend_specdecode.speculators.ngram:AscendNgramSpeculator",
}
# The upstream MRV2 speculator each family subclasses where only some vLLMs have it (probed before importing ours).
UPSTREAM_MODULES: dict[str, str] = {NGRAM: "vllm.v1.worker.gpu.spec_decode.ngram.speculator"}


def _load(qualname: str) -> type:
    module, _, name = qualname.partition(":")
    return getattr(importlib.import_module(module), name)


def select_speculator(speculative_config: Any) -> type:
    """The speculator class for `speculative_config`; ValueError naming the method when none fits."""
    family = speculator_family(speculative_config)
    if family == DRAFT_MODEL:
        raise ValueError(
            "speculative method 'draft_model' runs on upstream's standalone speculator; "
            "the Ascend speculators are dspark, dflash, mtp, eagle and ngram"
        )
    upstream = UPSTREAM_MODULES.get(family)
    if upstream is not None:
        from ascend_core.upstream.probes import module_exists

        if not module_exists(upstream):
            raise ValueError(f"speculative method {family!r} cannot run on this vLLM's Model Runner V2: {upstream} "
                             "is absent (use the V1 runner: VLLM_USE_V2_MODEL_RUNNER=0)")
    return _load(SPECULATOR_CLASSES[family])


def build_speculator(vllm_config: Any, device: Any, req_states: Any = None) -> Any:
    """Instantiate the selected speculator as upstream's `init_speculator` would (MRV2 runner hook); the n-gram
    speculator also takes the runner's `req_states` (the token rows it matches against)."""
    cls = select_speculator(vllm_config.speculative_config)
    if speculator_family(vllm_config.speculative_config) == NGRAM:
        if req_states is None:
            raise ValueError("the n-gram speculator needs the model runner's request states (req_states)")
        return cls(vllm_config, device, req_states)
    return cls(vllm_config, device)
