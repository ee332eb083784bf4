"""KV-cache layouts as permutations of the logical `[L, B, H, N, C]` axes, and the byte strides they give.

Mirrors the semantics of vLLM's `KVCacheLayout` (vllm/v1/kv_cache_layout.py) and `compute_layout_strides`, but
works from plain numbers so the same arithmetic serves the legacy lane (which has no layout module: its
per-layer buffers are block-major, i.e. LBHNC) and private per-layer buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = range(5)

# Physical order (outermost first) of the logical axes, by vLLM's layout names.
LAYOUT_ORDERS: dict[str, tuple[int, ...]] = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}
DEFAULT_LAYOUT = "LBHNC"


@dataclass(frozen=True)
class KVLayout:
    """A resolved layout: its name and the physical order of `[L, B, H, N, C]`."""

    name: str
    order: tuple[int, ...]

    def __post_init__(self):
        if sorted(self.order) != list(range(5)) or self.order[-1] != DIM_C:
            raise ValueError(f"layout {self.name}: order {self.order} is not a permutation of [L,B,H,N,C] ending in C")

    @property
    def is_block_compact(self) -> bool:
        """Each page's `[H, N, C]` bytes form one contiguous run (L and B are the two outermost axes)."""
        return set(self.order[:2]) == {DIM_L, DIM_B}

    @property
    def is_block_outermost(self) -> bool:
        return self.order[0] == DIM_B


def resolve_layout(layout: Any = None, kv_cache_config: Any = None) -> KVLayout:
    """`layout` may be a vLLM `KVCacheLayout`, a name, a `KVLayout` or None (then the config's resolved layout,
    then LBHNC: the block-major per-layer layout every lane can express)."""
    if isinstance(layout, KVLayout):
        return layout
    if layout is None:
        layout = getattr(kv_cache_config, "kv_cache_layout", None) or DEFAULT_LAYOUT
    if hasattr(layout, "stride_order"):
        return KVLayout(layout.name, tuple(layout.stride_order))
    name = str(layout).upper()
    if name not in LAYOUT_ORDERS:
        raise ValueError(f"unknown KV cache layout {layout!r}; known: {sorted(LAYOUT_ORDERS)}")
    return KVLayout(name, LAYOUT_ORDERS[name])


def layout_strides(
    shape: tuple[int, int, int, int, int],
    layout: KVLayout,
    *,
    padded_page: int | None = None,
    fixed: tuple[int | None, ...] = (None,) * 5,
) -> tuple[int, ...]:
    """Byte strides of `shape` (`[L, B, H, N, C]`, C in bytes) in logical axis order.

    Axes are dense from the innermost out, except that a padded page widens the stride of the innermost of L/B
    to `padded_page`, and `fixed` strides (the descriptor's layer/block strides) are taken as given.
    """
    order = layout.order
    page_grid_end = max(order.index(DIM_L), order.index(DIM_B)) + 1
    if padded_page is not None:
        grid = prod(shape[d] for d in order[:page_grid_end])
        if grid != shape[DIM_L] * shape[DIM_B]:
            raise ValueError(f"layout {layout.name} cannot pad pages of shape {shape}: axes other than L and B lie "
                             f"outside the page")
    strides = [0] * 5
    current = 1
    for physical, dim in reversed(tuple(enumerate(order))):
        if padded_page is not None and physical == page_grid_end - 1:
            current = max(current, padded_page)
        strides[dim] = fixed[dim] or current
        current = strides[dim] * shape[dim]
    return tuple(strides)


def span_bytes(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Bytes from the first to one past the last byte an `as_strided(shape, strides)` view touches."""
    if 0 in shape:
        return 0
    return sum((n - 1) * st for n, st in zip(shape, strides, strict=True)) + 1
