"""Speculative decoding for vLLM on Ascend: EAGLE/MTP, DFlash/DFlash2 and DSpark speculators and their vLLM glue.

Public API (see README.md):
  select_speculator(speculative_config) -> class   dispatch dspark -> dflash(2) -> mtp -> eagle -> ngram
  validate_speculative_config(spec, target)        one SpeculativeConfigError naming every bad value
  acceptance_from_metrics(llm.get_metrics())       per-position acceptance and mean accepted length
  AcceptanceReport.check_floor(floor)              fails naming each position under its floor
  install_speculative_decoding(runner)             drafter and verifier for a model runner (platform hook)
Names are resolved lazily so that importing the package does not import vLLM's model runners.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "select_speculator": "ascend_specdecode.dispatch",
    "build_speculator": "ascend_specdecode.dispatch",
    "speculator_family": "ascend_specdecode.methods",
    "method_family": "ascend_specdecode.methods",
    "validate_speculative_config": "ascend_specdecode.config_check",
    "SpeculativeConfigError": "ascend_specdecode.config_check",
    "AcceptanceReport": "ascend_specdecode.metrics",
    "AcceptanceBelowFloor": "ascend_specdecode.metrics",
    "AcceptanceFloorLogger": "ascend_specdecode.metrics",
    "acceptance_from_metrics": "ascend_specdecode.metrics",
    "acceptance_from_stats": "ascend_specdecode.metrics",
    "install_speculative_decoding": "ascend_specdecode.runner_hooks",
    "install_verifier": "ascend_specdecode.runner_hooks",
    "AscendRejectionSampler": "ascend_specdecode.verification",
    "AscendMRV2RejectionSampler": "ascend_specdecode.mrv2_verification",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ascend_specdecode' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
