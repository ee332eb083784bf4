"""DeepSeek V4's KV storage precision, applied to transformers' float64 V4 (`deepseek_v4_reference`).

vLLM's V4 layers keep every latent row in DeepSeek's fp8_ds_mla cache format (vLLM forces it for V4: the layers'
`use_fp8_ds_mla_layout`), and the indexer's compressed keys as fp8 rows with one power-of-two scale each. The tiny
random checkpoints are chaotic (their weights are drawn with a large range so that every part of the model matters):
that storage rounding alone moves a routing or indexer decision a few tokens in, and a float64 reference without it
soon stops predicting an engine's tokens, right or wrong. With these hooks the reference stores what the cache
stores, and keeps computing everything else in float64:

- a latent row (sliding-window and compressed, `kv_norm` outputs of the attention and its compressor) is rounded to
  bfloat16, its NoPE part then quantized to float8_e4m3fn in tiles of 64 with a UE8M0 (power-of-two) scale each;
- an indexer key row (the indexer compressor's `kv_norm` output) is rounded to bfloat16 and quantized to
  float8_e4m3fn with one power-of-two scale.

The rounding is applied where the row is normalised, before its rotary part is rotated (the engine stores after
rotating): the NoPE dims are exact, the rotated dims differ from the engine's by at most a bfloat16 / fp8 step.
"""

from __future__ import annotations

from typing import Any

STORAGES = ("fp8_ds_mla",)
ROPE_DIM = 64
NOPE_TILE = 64
FP8_MAX = 448.0
SCALE_FLOOR = 1e-4  # the smallest amax / 448 a scale is derived from (an all-zero row keeps a finite scale)


def _pow2_scale(amax: Any) -> Any:
    import torch

    return torch.exp2(torch.ceil(torch.log2((amax / FP8_MAX).clamp(min=SCALE_FLOOR))))


def _fp8(x: Any, scale: Any) -> Any:
    import torch

    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype) * scale


def stored_latent(row: Any) -> Any:
    """A latent row `[..., nope + 64]` as fp8_ds_mla stores it (bf16, then fp8 NoPE tiles with UE8M0 scales)."""
    import torch

    row = row.to(torch.bfloat16).to(row.dtype)
    nope, rope = row[..., :-ROPE_DIM], row[..., -ROPE_DIM:]
    tiles = nope.unflatten(-1, (-1, NOPE_TILE))
    stored = _fp8(tiles, _pow2_scale(tiles.abs().amax(-1, keepdim=True)))
    return torch.cat((stored.flatten(-2), rope), dim=-1)


def stored_indexer_key(row: Any) -> Any:
    """An indexer key row as its cache stores it (bf16, then fp8 with one power-of-two scale)."""
    import torch

    row = row.to(torch.bfloat16).to(row.dtype)
    return _fp8(row, _pow2_scale(row.abs().amax(-1, keepdim=True)))


def store_like(hf: Any, storage: str) -> None:
    """Make transformers' V4 `hf` round its cached rows as an engine's `storage` holds them (forward hooks)."""
    if storage not in STORAGES:
        raise ValueError(f"unknown V4 KV storage {storage!r} (known: {', '.join(STORAGES)})")
    hooked = 0
    for name, module in hf.named_modules():
        if not name.endswith("kv_norm"):
            continue
        store = stored_indexer_key if name.endswith("indexer.kv_norm") else stored_latent
        module.register_forward_hook(lambda _m, _i, out, store=store: store(out))
        hooked += 1
    if not hooked:
        raise ValueError("no kv_norm module in the model: not transformers' DeepSeek V4?")
