"""DeepSeek V4's cache byte layouts and the arithmetic every V4 op shares: GPT-J RoPE, bf16 rounding, fp8 quantization.

Two paged uint8 layouts, each seen by the ops as a 2-D `[num_blocks, >= bytes per block]` view whose row stride may
exceed its width (a layer's page inside a pooled allocation); a slot `s` is row `s // block_size`, entry
`s % block_size`:
- fp8_ds_mla (the sliding-window and compressed KV caches): per block, first `block_size` token records of
  `nope_dim` float8_e4m3fn bytes followed by `rope_dim` bfloat16 values, then `block_size` scale records of
  `nope_dim // 64` UE8M0 exponent bytes (scale `2 ** (byte - 127)`, one per 64 nope values) and one zero pad byte.
- the indexer K cache: per block, `block_size` records of `head_dim` float8_e4m3fn bytes, then `block_size` float32
  scales (one per record).
These are vLLM's (csrc/cpu/sgl-kernels/store_cache.cpp, compressor.cpp, flash_mla.cpp, paged_mqa_logits.cpp), so
caches written here read back byte for byte the way vLLM's kernels read them.
"""

from __future__ import annotations

import torch

ROPE_DIM = 64  # DeepSeek V4's qk_rope_head_dim: the bf16 tail of an fp8_ds_mla record
QUANT_BLOCK = 64  # nope values per UE8M0 scale in fp8_ds_mla
FP8_MAX = 448.0
SCALE_FLOOR = 1e-4  # the smallest amax / 448 (or amax, for the indexer) a scale is derived from
_FP8 = torch.float8_e4m3fn
_FP8_MIN_NORMAL = 2.0**-6


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for every float dtype but float64, which stays float64 (the tests' exact formulations)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest bfloat16 and back (the bf16 round trips upstream's kernels make on purpose)."""
    return x.to(torch.bfloat16).to(x.dtype)


def cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """(cos, sin) rows `[n, rope_dim // 2]` of a `[max_pos, rope_dim]` cache laid out as `[cos... | sin...]`."""
    rows = cos_sin_cache.index_select(0, positions.long()).to(dtype)
    half = rows.shape[-1] // 2
    return rows[..., :half], rows[..., half:]


def gptj_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """Interleaved (GPT-J) rotation of pairs `(x[2i], x[2i+1])` by angle i; `inverse` rotates back. cos/sin broadcast
    against `x[..., ::2]`."""
    even, odd = x[..., 0::2], x[..., 1::2]
    if inverse:
        sin = -sin
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def pow2_scale_exponent(amax: torch.Tensor, divisor: float, floor: float, *, floor_first: bool) -> torch.Tensor:
    """`ceil(log2(s))` in float32 for the power-of-two scale of a block with absolute maximum `amax`.

    fp8_ds_mla: `s = max(amax / 448, 1e-4)` (`floor_first=False`); the indexer: `s = max(amax, 1e-4) / 448`. The
    division and log2 run in float32 as upstream's kernels do, so the exponent matches theirs at block boundaries.
    """
    amax = amax.float()
    s = (amax / divisor).clamp_min(floor) if not floor_first else amax.clamp_min(floor) / divisor
    return torch.ceil(torch.log2(s))


def to_fp8(scaled: torch.Tensor, *, flush_subnormals: bool) -> torch.Tensor:
    """float32 values already clamped to +-448 -> float8_e4m3fn, round to nearest even. `flush_subnormals`: values
    below the smallest normal (2^-6) become signed zero, as the sliding-window insert's vectorised conversion does."""
    if flush_subnormals:
        scaled = torch.where(scaled.abs() < _FP8_MIN_NORMAL, torch.copysign(torch.zeros_like(scaled), scaled), scaled)
    return scaled.to(_FP8)


def quantize_ue8m0_tiles(nope: torch.Tensor, *, flush_subnormals: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """nope float32 `[n, nope_dim]` (already bf16-rounded) -> (fp8 bytes uint8 `[n, nope_dim]`, UE8M0 exponent
    bytes uint8 `[n, nope_dim // 64]`)."""
    tiles = nope.float().unflatten(-1, (-1, QUANT_BLOCK))
    exponent = pow2_scale_exponent(tiles.abs().amax(-1), FP8_MAX, SCALE_FLOOR, floor_first=False)
    inv = 1.0 / torch.exp2(exponent)
    scaled = (tiles * inv.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    values = to_fp8(scaled, flush_subnormals=flush_subnormals).view(torch.uint8).flatten(-2)
    return values, (exponent + 127).to(torch.uint8)


def ds_mla_record_bytes(nope_dim: int, rope_dim: int = ROPE_DIM) -> tuple[int, int]:
    """(token record bytes, scale record bytes) of the fp8_ds_mla layout."""
    return nope_dim + 2 * rope_dim, nope_dim // QUANT_BLOCK + 1


def _records(cache_2d: torch.Tensor, block_size: int, offset: int, width: int) -> torch.Tensor:
    """The `[num_blocks, block_size, width]` byte records starting `offset` bytes into each block row: a strided view
    of the cache, so indexing it by (block, entry) gathers or scatters whole records."""
    return cache_2d.as_strided((cache_2d.shape[0], block_size, width), (cache_2d.stride(0), width, 1),
                               cache_2d.storage_offset() + offset)


def write_ds_mla(cache_2d: torch.Tensor, block_size: int, slots: torch.Tensor, nope: torch.Tensor,
                 rope: torch.Tensor, *, flush_subnormals: bool) -> None:
    """Store records at `slots` (all >= 0): nope float `[n, nope_dim]` (bf16-rounded) quantized with UE8M0 scales,
    rope float `[n, rope_dim]` stored as bfloat16."""
    if slots.numel() == 0:
        return
    nope_dim, rope_dim = nope.shape[1], rope.shape[1]
    token_bytes, scale_bytes = ds_mla_record_bytes(nope_dim, rope_dim)
    values, exponents = quantize_ue8m0_tiles(nope, flush_subnormals=flush_subnormals)
    rope_bytes = rope.to(torch.bfloat16).contiguous().view(torch.uint8)
    scales = torch.cat((exponents, torch.zeros_like(exponents[:, :1])), dim=1)
    block, pos = slots // block_size, slots % block_size
    _records(cache_2d, block_size, 0, token_bytes)[block, pos] = torch.cat((values, rope_bytes), dim=1)
    _records(cache_2d, block_size, block_size * token_bytes, scale_bytes)[block, pos] = scales


def read_ds_mla(cache_2d: torch.Tensor, block_size: int, slots: torch.Tensor, nope_dim: int,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantized records at `slots` (all >= 0) -> `[n, nope_dim + rope_dim]` in `dtype`."""
    token_bytes, scale_bytes = ds_mla_record_bytes(nope_dim)
    block, pos = slots // block_size, slots % block_size
    record = _records(cache_2d, block_size, 0, token_bytes)[block, pos]
    exponents = _records(cache_2d, block_size, block_size * token_bytes, scale_bytes)[block, pos][:, :-1].to(dtype)
    # UE8M0: 2^(e - 127); byte 0 reads as 0 and 255 as NaN, as vLLM's fp8_e8m0_to_float does
    scale = torch.where(exponents == 0, torch.zeros_like(exponents), torch.exp2(exponents - 127))
    scale = torch.where(exponents == 255, torch.full_like(scale, float("nan")), scale)
    nope = record[:, :nope_dim].contiguous().view(_FP8).to(dtype).unflatten(-1, (-1, QUANT_BLOCK))
    rope = record[:, nope_dim:].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat(((nope * scale.unsqueeze(-1)).flatten(-2), rope), dim=1)


def write_indexer(cache_2d: torch.Tensor, block_size: int, slots: torch.Tensor, values: torch.Tensor,
                  scales: torch.Tensor) -> None:
    """Store fp8 records values float8_e4m3fn `[n, head_dim]` and float32 scales `[n]` at `slots` (all >= 0)."""
    if slots.numel() == 0:
        return
    head_dim = values.shape[1]
    block, pos = slots // block_size, slots % block_size
    _records(cache_2d, block_size, 0, head_dim)[block, pos] = values.contiguous().view(torch.uint8)
    scale_bytes = scales.float().contiguous().view(torch.uint8).view(-1, 4)
    _records(cache_2d, block_size, block_size * head_dim, 4)[block, pos] = scale_bytes


def read_indexer(cache_2d: torch.Tensor, block_size: int, slots: torch.Tensor, head_dim: int):
    """(fp8 values as float32 `[n, head_dim]`, float32 scales `[n]`) of the records at `slots` (all >= 0)."""
    block, pos = slots // block_size, slots % block_size
    values = _records(cache_2d, block_size, 0, head_dim)[block, pos].view(_FP8).float()
    scales = _records(cache_2d, block_size, block_size * head_dim, 4)[block, pos].view(torch.float32)
    return values, scales.view(-1)
