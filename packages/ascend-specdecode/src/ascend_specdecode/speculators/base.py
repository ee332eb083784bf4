"""What every Ascend speculator adds to its upstream Model Runner V2 parent.

- `propose()` takes the data-parallel argument of any vLLM lane (``num_tokens_across_dp``, ``dp_sync`` or
  ``dp_sync_state``) and forwards it under the name the installed vLLM takes (adapter in `ascend_core.upstream`).
- Draft attention metadata is decode-only: no draft request is ever marked as prefilling, and metadata objects
  that carry an Ascend ``attn_state`` get its ``DecodeOnly`` member, so NPU kernels take the decode path.
- `ascend_counts`: what this speculator did (proposals, the DP argument forwarded, draft metadata built, and each
  method's own stage), per instance so that engines sharing a process never mix their counts; tests read it to
  show that an engine drafted through our class and which path it took.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ascend_core.upstream import pop_speculator_dp, speculator_dp_arg

DECODE_ONLY_STATE = "DecodeOnly"


def forward_dp_argument(value: Any, propose: Any) -> dict[str, Any]:
    """`{name: value}` for the DP argument `propose` takes; a legacy lane gets the token counts of a sync state."""
    name = speculator_dp_arg(propose)
    if name is None:
        return {}
    if name == "num_tokens_across_dp" and hasattr(value, "num_tokens_across_dp"):
        value = value.num_tokens_across_dp
    return {name: value}


def mark_decode_only(attn_metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """Set ``attn_state`` to its ``DecodeOnly`` member on every metadata object that has one (Ascend builders)."""
    for meta in (attn_metadata or {}).values():
        state = getattr(meta, "attn_state", None)
        member = getattr(type(state), DECODE_ONLY_STATE, None) if state is not None else None
        if member is not None:
            meta.attn_state = member
    return attn_metadata


class AscendSpeculatorMixin:
    """Put first in the bases of a subclass of an upstream `DraftModelSpeculator`."""

    #: Draft steps never prefill: their attention metadata is built decode-only.
    decode_only_draft_attention = True

    @property
    def ascend_counts(self) -> Counter[str]:
        return self.__dict__.setdefault("_ascend_counts", Counter())

    def propose(self, *args: Any, **kwargs: Any) -> Any:
        dp_value = pop_speculator_dp(kwargs)
        parent_propose = super().propose  # type: ignore[misc]
        forwarded = forward_dp_argument(dp_value, parent_propose)
        kwargs.update(forwarded)
        self.ascend_counts["dummy_propose" if kwargs.get("dummy_run", False) else "propose"] += 1
        for name, value in forwarded.items():
            self.ascend_counts[f"dp:{name}={'none' if value is None else type(value).__name__}"] += 1
        return parent_propose(*args, **kwargs)

    def _build_attn_metadata(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        prefilling = getattr(self, "draft_is_prefilling", None)
        if prefilling is not None:
            prefilling.zero_()
        self.ascend_counts["decode_only_metadata"] += 1
        return mark_decode_only(super()._build_attn_metadata(*args, **kwargs))  # type: ignore[misc]
