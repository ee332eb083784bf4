"""FIA's input_layout: how query/key/value (and the output) lay out B, S, N, D or T, N, D.

Everything is turned into one of two canonical forms: batch-major [B, N, S, D] (BSH/BSND/BNSD) or token-major
[T, N, D] (TND/NTD, with cumulative lengths). The pairs "IN_OUT" (BNSD_BSND, TND_NTD, ...) read the query in the
first layout and write the output in the second, as torch_npu's meta function maps them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, unmodelled

BATCH_MAJOR = ("BSH", "BSND", "BNSD")
TOKEN_MAJOR = ("TND", "NTD")


@dataclass(frozen=True)
class Layout:
    name: str
    query: str  # how query, key, value (unpaged) and the ropes are laid out
    out: str  # how attention_out is laid out

    @property
    def token_major(self) -> bool:
        return self.query in TOKEN_MAJOR


# torch_npu's get_query_and_attention_out_layout table, minus NSD (a squeezed BNSD nobody here uses).
LAYOUTS = {
    name: Layout(name, query, out)
    for name, query, out in (
        ("BSH", "BSH", "BSH"), ("BSND", "BSND", "BSND"), ("BNSD", "BNSD", "BNSD"), ("TND", "TND", "TND"),
        ("NTD", "NTD", "NTD"), ("BNSD_BSND", "BNSD", "BSND"), ("BSH_BNSD", "BSH", "BNSD"),
        ("BSND_BNSD", "BSND", "BNSD"), ("NTD_TND", "NTD", "TND"), ("BSH_NBSD", "BSH", "NBSD"),
        ("BSND_NBSD", "BSND", "NBSD"), ("BNSD_NBSD", "BNSD", "NBSD"), ("TND_NTD", "TND", "NTD"),
    )
}


def parse_layout(op: str, input_layout: str) -> Layout:
    if input_layout == "NSD":
        unmodelled(op, "input_layout", input_layout)
    if input_layout not in LAYOUTS:
        refuse(op, f"input_layout must be one of {sorted(LAYOUTS)} (or NSD), got {input_layout!r}")
    return LAYOUTS[input_layout]


def to_canonical(op: str, layout: str, name: str, tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, N, S, D] for batch-major layouts, [T, N, D] for token-major ones; N is checked against `heads`."""
    expected_dims = 3 if layout in ("BSH", "TND", "NTD") else 4
    if tensor.dim() != expected_dims:
        refuse(op, f"{name} must be {expected_dims}-D for layout {layout}, got shape {tuple(tensor.shape)}")
    if layout == "BSH":
        b, s, h = tensor.shape
        if h % heads:
            refuse(op, f"{name} hidden size {h} (layout BSH) is not a multiple of its head count {heads}")
        return tensor.reshape(b, s, heads, h // heads).permute(0, 2, 1, 3)
    canonical = {
        "BSND": lambda t: t.permute(0, 2, 1, 3),
        "BNSD": lambda t: t,
        "TND": lambda t: t,
        "NTD": lambda t: t.permute(1, 0, 2),
    }[layout](tensor)
    if canonical.shape[1] != heads:
        refuse(op, f"{name} has {canonical.shape[1]} heads in layout {layout}, but the head count is {heads}")
    return canonical


def from_canonical(layout: str, canonical: torch.Tensor) -> torch.Tensor:
    """The inverse of to_canonical for attention_out's layout (including NBSD, an output-only layout)."""
    if layout == "BSH":
        b, n, s, d = canonical.shape
        return canonical.permute(0, 2, 1, 3).reshape(b, s, n * d)
    return {
        "BSND": lambda t: t.permute(0, 2, 1, 3),
        "BNSD": lambda t: t,
        "NBSD": lambda t: t.permute(1, 0, 2, 3),
        "TND": lambda t: t,
        "NTD": lambda t: t.permute(1, 0, 2),
    }[layout](canonical).contiguous()
