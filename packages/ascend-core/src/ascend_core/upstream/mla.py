"""Adapters for the MLA compression ratio (`compress_ratio` on the legacy lane, `tokens_per_state` now)."""

from __future__ import annotations

import dataclasses
from typing import Any

_RATIO_FIELDS = ("tokens_per_state", "compress_ratio")


def mla_ratio_field(spec_or_cls: Any) -> str:
    names = {f.name for f in dataclasses.fields(spec_or_cls)}
    for field in _RATIO_FIELDS:
        if field in names:
            return field
    raise TypeError(f"{getattr(spec_or_cls, '__name__', type(spec_or_cls).__name__)} has neither "
                    f"'tokens_per_state' nor 'compress_ratio'")


def mla_ratio(spec: Any) -> int:
    """Tokens per stored KV state of an MLA-like spec (1 = uncompressed)."""
    return int(getattr(spec, mla_ratio_field(spec)) or 1)


def mla_ratio_kwargs(ratio: int, spec_cls: Any) -> dict[str, int]:
    """Constructor keywords that set the ratio on `spec_cls`, whichever lane it comes from."""
    if ratio < 1:
        raise ValueError(f"MLA ratio must be >= 1, got {ratio}")
    return {mla_ratio_field(spec_cls): ratio}


# The hooks through which Ascend's MLA backends take part in vLLM's MLA layer: the platform names the prefill backend
# the layer asks for, and the backend restates the layer's KV spec as Ascend's (rotary width). A vLLM without them
# (the legacy lane) would build the layer around its own prefill selector and plain specs, which our MLA impls do not
# serve, so MLA models are refused at start-up there.
MLA_HOOKS = (("vllm.platforms.interface", "Platform", "get_mla_prefill_backend_cls"),
             ("vllm.v1.attention.backend", "AttentionBackend", "customize_spec"))


def mla_hooks_unavailable_reason() -> str | None:
    """Why Ascend's MLA backends (ASCEND_MLA, sparse/compressed MLA) cannot run on the installed vLLM, or None."""
    import importlib

    from ascend_core.upstream.version import installed_vllm_version

    missing = [f"{cls}.{name}" for module, cls, name in MLA_HOOKS
               if not hasattr(getattr(importlib.import_module(module), cls), name)]
    if not missing:
        return None
    return (f"vLLM {installed_vllm_version()} has no {' / '.join(missing)}, the hooks through which Ascend's MLA "
            "backends join vLLM's MLA layer")
