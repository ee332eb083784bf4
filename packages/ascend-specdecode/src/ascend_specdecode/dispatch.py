"""`select_speculator(speculative_config)`: the Ascend Model Runner V2 speculator class for a config.

Dispatch order dspark -> dflash (DFlash2 for a DFlash2 draft) -> mtp -> eagle, as the reference plugin does; the
classes are imported lazily so that choosing one never imports the others' models.
"""

from __future__ import annotations

import importlib
from typing import Any

from ascend_specdecode.methods import DFLASH, DFLASH2, DRAFT_MODEL, DSPARK, EAGLE, MTP, speculator_family

SPECULATOR_CLASSES: dict[str, str] = {
    DSPARK: "ascend_specdecode.speculators.parallel:AscendDSparkSpeculator",
    DFLASH2: "ascend_specdecode.speculators.parallel:AscendDFlash2Speculator",
    DFLASH: "ascend_specdecode.speculators.parallel:AscendDFlashSpeculator",
    MTP: "ascend_specdecode.speculators.autoregressive:AscendMTPSpeculator",
    EAGLE: "ascend_specdecode.speculators.autoregressive:AscendEagleSpeculator",
}


def _load(qualname: str) -> type:
    module, _, name = qualname.partition(":")
    return getattr(importlib.import_module(module), name)


def select_speculator(speculative_config: Any) -> type:
    """The speculator class for `speculative_config`; ValueError naming the method when none fits."""
    family = speculator_family(speculative_config)
    if family == DRAFT_MODEL:
        raise ValueError(
            "speculative method 'draft_model' runs on upstream's standalone speculator; "
            "the Ascend speculators are dspark, dflash, mtp and eagle"
        )
    return _load(SPECULATOR_CLASSES[family])


def build_speculator(vllm_config: Any, device: Any) -> Any:
    """Instantiate the selected speculator as upstream's `init_speculator` would (MRV2 runner hook)."""
    return select_speculator(vllm_config.speculative_config)(vllm_config, device)
