"""Validation of a speculative-decoding configuration, before any engine is built.

A misconfigured draft does not crash: it drafts tokens nobody accepts, and acceptance silently sinks to zero. So a
bad method, a draft vocabulary that differs from the target's or a non-positive number of speculative tokens is one
`SpeculativeConfigError` that names every bad value at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ascend_specdecode.methods import DFLASH2, draft_architectures, method_family, upstream_only_variant


class SpeculativeConfigError(ValueError):
    """A speculative configuration the plugin refuses; the message lists each problem with its value."""


def _get(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _vocab_of(model_config: Any) -> int | None:
    """The vocabulary size of a vLLM ModelConfig, an HF config, or a plain int/mapping."""
    if model_config is None or isinstance(model_config, int):
        return model_config
    if isinstance(model_config, Mapping):
        return model_config.get("vocab_size")
    getter = getattr(model_config, "get_vocab_size", None)
    if callable(getter):
        return int(getter())
    hf = getattr(model_config, "hf_config", model_config)
    return getattr(hf, "vocab_size", None)


# Methods whose draft maps its truncated vocabulary into the target's (EAGLE-3's ``d2t`` table: vLLM's eagle3 models
# scatter the draft's logits over the target vocabulary), so its tokens are target tokens whatever its head's size.
MAPPED_VOCAB_METHODS = frozenset({"eagle3"})


def _draft_output_vocab(speculative_config: Any) -> int | None:
    """The size of the vocabulary the draft proposes from (`draft_vocab_size` when the draft truncates it; the
    target-id space of a draft that maps a truncated head into it)."""
    if _get(speculative_config, "method") in MAPPED_VOCAB_METHODS:
        draft = _get(speculative_config, "draft_model_config")
        return None if draft is None else _vocab_of(draft)
    given = _get(speculative_config, "draft_vocab_size")
    if given is not None:
        return int(given)
    draft = _get(speculative_config, "draft_model_config")
    if draft is None:
        return None
    hf = getattr(draft, "hf_config", draft)
    truncated = getattr(hf, "draft_vocab_size", None)
    return int(truncated) if truncated is not None else _vocab_of(draft)


def validate_speculative_config(
    speculative_config: Any, target_model_config: Any = None, *, target_vocab_size: int | None = None
) -> str:
    """Check `speculative_config` (a vLLM SpeculativeConfig or a mapping) and return its speculator family.

    The target vocabulary comes from `target_vocab_size`, else `target_model_config`, else the config's own
    `target_model_config`. Raises `SpeculativeConfigError` listing every problem found.
    """
    problems: list[str] = []
    family = None
    method = _get(speculative_config, "method")
    try:
        family = method_family(method, draft_architectures(speculative_config))
    except ValueError as exc:
        problems.append(str(exc))
    if family == DFLASH2:
        from ascend_core.upstream import dflash2_unavailable_reason

        refused = dflash2_unavailable_reason()
        if refused is not None:
            problems.append(f"DFlash2 drafts cannot run here: {refused}")
    variant = None if isinstance(speculative_config, Mapping) else upstream_only_variant(speculative_config)
    if variant is not None:
        problems.append(f"{variant} is not run by the Ascend speculators")

    k = _get(speculative_config, "num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        problems.append(f"num_speculative_tokens must be a positive integer, got {k!r}")

    if target_vocab_size is None:
        target_vocab_size = _vocab_of(target_model_config or _get(speculative_config, "target_model_config"))
    draft_vocab = _draft_output_vocab(speculative_config)
    if target_vocab_size is not None and draft_vocab is not None and draft_vocab != target_vocab_size:
        problems.append(
            f"draft vocabulary size {draft_vocab} differs from the target's {target_vocab_size} "
            f"(draft {_get(speculative_config, 'model')!r}); drafts would index different tokens"
        )

    if problems:
        raise SpeculativeConfigError("invalid speculative config: " + "; ".join(problems))
    assert family is not None
    return family
