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
