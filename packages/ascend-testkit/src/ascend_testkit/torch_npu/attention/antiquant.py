"""FIA _v2's KV antiquant ("kv伪量化参数分离" in torch_npu's docs): int8 keys and values read as `(x + offset) *
scale` with `dequant_scale_key` / `dequant_offset_key` / `dequant_scale_value` / `dequant_offset_value` under
`key_quant_mode` / `value_quant_mode`.

Modelled, in float64: mode 0 (per-channel, which covers per-tensor) in the incremental branch (every query one
token, a batch-major layout), with int8 caches or dense int8 keys and values; the scale decides the form by its
shape: per channel `(1, N, 1, D)`, `(1, N, D)` or `(1, H)` (N the KV heads, H = N * D), per tensor `(1,)`, in the
query's dtype. Refused as the docs state them: scales or offsets given for one of key / value only, offsets without
scales, key and value parameters of different shapes, modes that differ (other than key 0 with value 1), a scale
dtype other than the query's, keys that are not int8, page attention over int8 caches with a block size off 32, and
antiquant where the docs rule it out (a query longer than one token over page attention; TND / NTD layouts).
Unmodelled (NotImplementedError): the other modes (per-token and the per-head / paged-scale forms), int4 keys, and
antiquant in the prompt branch without page attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, unmodelled

INT8_PAGED_BLOCK_GRANULARITY = 32


@dataclass(frozen=True)
class AntiquantArgs:
    """The _v2 call's antiquant arguments, as given."""

    key_scale: torch.Tensor | None
    key_offset: torch.Tensor | None
    value_scale: torch.Tensor | None
    value_offset: torch.Tensor | None
    key_mode: int
    value_mode: int

    @property
    def given(self) -> bool:
        return any(t is not None for t in (self.key_scale, self.key_offset, self.value_scale, self.value_offset))


@dataclass(frozen=True)
class Dequant:
    """Per-channel float64 scale and offset vectors (`[H]`, or `[1]` per tensor) for keys and for values."""

    key_scale: torch.Tensor
    key_offset: torch.Tensor
    value_scale: torch.Tensor
    value_offset: torch.Tensor

    @staticmethod
    def _apply(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """x [KV_N, S, D] int8 -> float64 `(x + offset) * scale`, channel (n, d) at n * D + d."""
        heads, _, dim = x.shape

        def shaped(t: torch.Tensor) -> torch.Tensor:
            return t.view(heads, 1, dim) if t.numel() > 1 else t.view(1, 1, 1)
        return (x.double() + shaped(offset)) * shaped(scale)

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply(x, self.key_scale, self.key_offset)

    def values(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply(x, self.value_scale, self.value_offset)


def _pairs(op: str, args: AntiquantArgs) -> None:
    if (args.key_scale is None) != (args.value_scale is None):
        refuse(op, "dequant_scale_key and dequant_scale_value must be given together or not at all")
    if (args.key_offset is None) != (args.value_offset is None):
        refuse(op, "dequant_offset_key and dequant_offset_value must be given together or not at all")
    if args.key_scale is None:
        refuse(op, "dequant_offset_key / dequant_offset_value given without dequant_scale_key / dequant_scale_value")
    if args.key_mode != args.value_mode and (args.key_mode, args.value_mode) != (0, 1):
        refuse(op, f"key_quant_mode={args.key_mode} and value_quant_mode={args.value_mode} must be equal (or 0 and 1)")
    if (args.key_mode, args.value_mode) != (0, 0):
        unmodelled(op, "key_quant_mode/value_quant_mode", (args.key_mode, args.value_mode))


def _vector(op: str, name: str, t: torch.Tensor, heads: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    hidden = heads * dim
    forms = {(1,), (1, heads, 1, dim), (1, heads, dim), (1, hidden)}
    if tuple(t.shape) not in forms:
        refuse(op, f"{name} must be (1,) (per tensor) or (1, {heads}, 1, {dim}), (1, {heads}, {dim}), (1, {hidden}) "
                   f"(per channel) with key_quant_mode 0, got {tuple(t.shape)}")
    if t.dtype != dtype:
        refuse(op, f"{name} dtype must be the query's ({dtype}) in per-channel mode, got {t.dtype}")
    return t.double().reshape(-1)


def resolve_antiquant(op: str, args: AntiquantArgs, *, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, token_major: bool, incremental: bool, paged: bool, block_size: int,
                      num_kv_heads: int, int8_granularity: int) -> Dequant | None:
    """The call's dequantization (None without antiquant arguments), after the documented checks."""
    if not args.given:
        if (args.key_mode, args.value_mode) != (0, 0):
            unmodelled(op, "key_quant_mode/value_quant_mode", (args.key_mode, args.value_mode))
        return None
    _pairs(op, args)
    if query.dtype not in (torch.float16, torch.bfloat16):
        refuse(op, f"KV antiquant takes a float16 / bfloat16 query, got {query.dtype}")
    if token_major:
        refuse(op, "TND / NTD layouts take no KV antiquant (dequant_scale_key / dequant_scale_value)")
    if not incremental:
        if paged:
            refuse(op, "page attention takes no KV antiquant when a query is longer than one token")
        unmodelled(op, "KV antiquant with a query longer than one token", "without page attention")
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype in (torch.int32,):
            unmodelled(op, f"{name} dtype (int4 packed in int32)", tensor.dtype)
        if tensor.dtype != torch.int8:
            refuse(op, f"{name} must be int8 with KV antiquant, got {tensor.dtype}")
    if paged and block_size % int8_granularity:
        refuse(op, f"page attention over int8 caches needs block_size a multiple of {int8_granularity}, got "
                   f"{block_size}")
    dim = key.shape[-1] if not paged or key.dim() == 4 else key.shape[-1] // num_kv_heads
    shapes = {name: tuple(t.shape) for name, t in (("dequant_scale_key", args.key_scale),
                                                   ("dequant_scale_value", args.value_scale))}
    if len(set(shapes.values())) != 1:
        refuse(op, f"dequant_scale_key and dequant_scale_value must have one shape, got {shapes}")
    scales = [_vector(op, name, t, num_kv_heads, dim, query.dtype)
              for name, t in (("dequant_scale_key", args.key_scale), ("dequant_scale_value", args.value_scale))]
    if args.key_offset is None:
        offsets = [torch.zeros(1, dtype=torch.float64)] * 2
    else:
        for name, t in (("dequant_offset_key", args.key_offset), ("dequant_offset_value", args.value_offset)):
            if tuple(t.shape) != tuple(args.key_scale.shape):
                refuse(op, f"{name} must have the scales' shape {tuple(args.key_scale.shape)}, got {tuple(t.shape)}")
        offsets = [_vector(op, name, t, num_kv_heads, dim, query.dtype)
                   for name, t in (("dequant_offset_key", args.key_offset),
                                   ("dequant_offset_value", args.value_offset))]
    return Dequant(scales[0], offsets[0], scales[1], offsets[1])
