"""Which speculator family a speculative config asks for, decided in the order the Ascend plugin dispatches.

Order: dspark -> dflash (DFlash2 when the draft declares a DFlash2 architecture) -> mtp -> eagle. ``draft_model``
(an independent small LM) is accepted too: it is the one method whose draft can be literally the target. So is
``ngram`` (prompt lookup: drafts copied from the request's own tokens, no draft model and no device kernel).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DSPARK = "dspark"
DFLASH = "dflash"
DFLASH2 = "dflash2"
MTP = "mtp"
EAGLE = "eagle"
DRAFT_MODEL = "draft_model"
NGRAM = "ngram"

# Dispatch order of the target-dependent families; draft_model and ngram are independent of the target, checked last.
DISPATCH_ORDER = (DSPARK, DFLASH, MTP, EAGLE)

EAGLE_METHODS = frozenset({"eagle", "eagle3"})
DFLASH2_ARCHITECTURES = frozenset({"DFlash2DraftModel"})
# DFlash drafts vLLM runs with a speculator of their own that this package has no Ascend version of: dispatching
# them as DFlash would silently drop their extra head.
OTHER_DFLASH_ARCHITECTURES = {"LiLiCorrDraftModel": "LiLiCorr correlator drafts"}
# Methods vLLM knows but this package does not speculate with (they need other runners or upstream's CUDA drafters;
# ``ngram_gpu`` is V1's CUDA n-gram proposer: ``ngram`` drafts the same n-grams on both runners here).
UNSUPPORTED_METHODS = frozenset(
    {"ngram_gpu", "medusa", "mlp_speculator", "suffix", "custom_class", "extract_hidden_states"}
)


def _mtp_model_types() -> frozenset[str]:
    """The MTP draft model types the installed vLLM names (``deepseek_mtp``, ``mimo_mtp``, ...)."""
    from typing import get_args

    from vllm.config.speculative import MTPModelTypes

    return frozenset(get_args(MTPModelTypes))


def draft_architectures(speculative_config: Any) -> tuple[str, ...]:
    draft = getattr(speculative_config, "draft_model_config", None)
    return tuple(getattr(draft, "architectures", None) or ())


def method_family(method: str | None, architectures: Iterable[str] = ()) -> str:
    """The family for `method` (raises ValueError naming the method when there is none)."""
    if method == DSPARK:
        return DSPARK
    if method == DFLASH:
        other = sorted(OTHER_DFLASH_ARCHITECTURES.keys() & set(architectures))
        if other:
            raise ValueError(f"speculative method 'dflash' with a {other[0]} draft "
                             f"({OTHER_DFLASH_ARCHITECTURES[other[0]]}) is not run by the Ascend speculators")
        return DFLASH2 if DFLASH2_ARCHITECTURES & set(architectures) else DFLASH
    if method == MTP or (method is not None and method in _mtp_model_types()):
        return MTP
    if method in EAGLE_METHODS:
        return EAGLE
    if method == DRAFT_MODEL:
        return DRAFT_MODEL
    if method == NGRAM:
        return NGRAM
    known = sorted({DSPARK, DFLASH, MTP, *EAGLE_METHODS, DRAFT_MODEL, NGRAM})
    why = "is not a speculative method this plugin runs" if method in UNSUPPORTED_METHODS else "is unknown"
    raise ValueError(f"speculative method {method!r} {why}; expected one of {known} (or an MTP model type)")


def upstream_only_variant(speculative_config: Any) -> str | None:
    """An MTP variant vLLM drafts with its own speculator (several MTP modules, Gemma4's KV-sharing MTP), which no
    Ascend speculator reproduces; None for everything else. Asked of the config, as vLLM's dispatch asks it."""
    for probe, what in (("use_multi_module_mtp", "multi-module MTP (one MTP module per draft step)"),
                        ("use_gemma4_mtp", "Gemma4 MTP")):
        check = getattr(speculative_config, probe, None)
        if callable(check) and check():
            return what
    return None


def speculator_family(speculative_config: Any) -> str:
    """The family of a vLLM `SpeculativeConfig` (method plus the draft's architectures)."""
    variant = upstream_only_variant(speculative_config)
    if variant is not None:
        raise ValueError(f"{variant} is not run by the Ascend speculators (method "
                         f"{getattr(speculative_config, 'method', None)!r})")
    return method_family(getattr(speculative_config, "method", None), draft_architectures(speculative_config))
