"""What each Ascend attention backend serves, checked at start-up so an unsupported model fails naming why.

`backend_refusals` answers for the selector (head size, dtypes, block size, context parallelism, attention type)
from vLLM's attention-selector config and the parallel sizes; `check_mla_impl_args` and
`check_encoder_only_impl_args` repeat the checks an impl can only make when its layer is built. Kept free of vLLM
imports: plain values in, reasons out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_MULTIPLE = 16
MODEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")
# vLLM's AttentionType values, and why the ones no Ascend backend serves are refused.
DECODER, ENCODER_ONLY = "decoder", "encoder_only"
UNSERVED_ATTN_TYPES = {
    "encoder": "encoder attention of an encoder-decoder model (e.g. Whisper's audio encoder)",
    "encoder_decoder": "cross-attention of an encoder-decoder model (e.g. Whisper's decoder)",
}


def attn_type_name(attn_type) -> str:
    """vLLM's AttentionType member (a str enum) or its value, as the plain value ('decoder', 'encoder_only', ...)."""
    return str(getattr(attn_type, "value", attn_type))


class AttentionConfigError(ValueError):
    """The model needs something the chosen Ascend attention backend does not do."""


@dataclass(frozen=True)
class AttentionRequest:
    """What vLLM asks of an attention backend, as plain values."""

    head_size: int
    dtype: torch.dtype
    kv_cache_dtype: str | None
    block_size: int | None
    pcp_size: int = 1
    dcp_size: int = 1
    latent_size: int | None = None
    """MLA: kv_lora_rank + qk_rope_head_dim of the model (what each cached state holds)."""
    attn_type: str = DECODER
    """vLLM's AttentionType of the layer asking (decoder; encoder_only for BERT-style embedding models)."""


@dataclass(frozen=True)
class BackendCaps:
    name: str
    context_parallel: bool = False
    head_sizes: tuple[int, ...] = ()  # empty: any
    attn_types: tuple[str, ...] = (DECODER,)


CAPS = {
    "ASCEND": BackendCaps("ASCEND", context_parallel=True),
    "ASCEND_310P": BackendCaps("ASCEND_310P", context_parallel=True),
    "ASCEND_MLA": BackendCaps("ASCEND_MLA"),
    "ASCEND_SFA": BackendCaps("ASCEND_SFA"),
    # no PCP/DCP: a pooling request is one prompt in one step, attended within that step
    "ASCEND_ENCODER_ONLY": BackendCaps("ASCEND_ENCODER_ONLY", attn_types=(ENCODER_ONLY,)),
}


def backend_refusals(name: str, req: AttentionRequest) -> list[str]:
    """Why backend `name` cannot serve `req` (empty when it can)."""
    caps = CAPS.get(name, BackendCaps(name))
    reasons = []
    if req.attn_type not in caps.attn_types:
        what = UNSERVED_ATTN_TYPES.get(req.attn_type, f"attention type {req.attn_type!r}")
        reasons.append(f"{what} is not served (serves: {', '.join(caps.attn_types)})")
    if req.head_size <= 0 or (caps.head_sizes and req.head_size not in caps.head_sizes):
        allowed = ", ".join(map(str, caps.head_sizes)) or "any positive size"
        reasons.append(f"head size {req.head_size} is not supported (supported: {allowed})")
    if req.latent_size is not None and req.head_size != req.latent_size:
        reasons.append(f"head size {req.head_size} is not the model's latent size kv_lora_rank + qk_rope_head_dim = "
                       f"{req.latent_size}")
    if req.dtype not in MODEL_DTYPES:
        reasons.append(f"dtype {req.dtype} is not supported (supported: float16, bfloat16, float32)")
    if req.kv_cache_dtype is not None and req.kv_cache_dtype not in KV_CACHE_DTYPES:
        reasons.append(f"kv_cache_dtype {req.kv_cache_dtype!r} is not supported (supported: "
                       f"{', '.join(KV_CACHE_DTYPES)})")
    if req.block_size is not None and req.block_size % BLOCK_MULTIPLE:
        reasons.append(f"block_size {req.block_size} is not a multiple of {BLOCK_MULTIPLE}")
    if not caps.context_parallel:
        for what, size in (("prefill context parallel (PCP)", req.pcp_size),
                           ("decode context parallel (DCP)", req.dcp_size)):
            if size > 1:
                reasons.append(f"{what} size {size} is not supported")
    return reasons


def check_backend(name: str, req: AttentionRequest) -> None:
    reasons = backend_refusals(name, req)
    if reasons:
        raise AttentionConfigError(f"Ascend attention backend {name} cannot serve this model: {'; '.join(reasons)}")


def check_mla_impl_args(*, alibi_slopes, sliding_window, logits_soft_cap, attn_type: str,
                        kv_sharing_target_layer_name, kv_cache_dtype: str, dcp_world_size: int, pcp_world_size: int,
                        head_size: int, kv_lora_rank: int, qk_rope_head_dim: int,
                        backend: str = "ASCEND_MLA") -> None:
    reasons = []
    for what, value in (("ALiBi slopes", alibi_slopes), ("a sliding window", sliding_window),
                        ("logits_soft_cap", logits_soft_cap), ("KV sharing", kv_sharing_target_layer_name)):
        if value:
            reasons.append(f"{what} ({value!r}) is not supported")
    if attn_type != "decoder":
        reasons.append(f"attention type {attn_type!r} is not supported (decoder only)")
    reasons += backend_refusals(backend, AttentionRequest(
        head_size=head_size, dtype=torch.float32, kv_cache_dtype=kv_cache_dtype, block_size=None,
        pcp_size=pcp_world_size, dcp_size=dcp_world_size, latent_size=kv_lora_rank + qk_rope_head_dim))
    if reasons:
        raise AttentionConfigError(f"Ascend attention backend {backend} cannot serve this layer: "
                                   f"{'; '.join(reasons)}")


def check_encoder_only_impl_args(*, attn_type: str, alibi_slopes, sliding_window, logits_soft_cap,
                                 kv_sharing_target_layer_name, sinks) -> None:
    """What an encoder-only layer asks of ASCEND_ENCODER_ONLY that the dense non-causal op cannot do."""
    reasons = []
    attn_type = attn_type_name(attn_type)
    if attn_type != ENCODER_ONLY:
        reasons.append(f"attention type {attn_type!r} is not supported (encoder_only only)")
    for what, value in (("ALiBi slopes", alibi_slopes),
                        ("a sliding window (e.g. ModernBERT's local attention layers)", sliding_window),
                        ("logits_soft_cap", logits_soft_cap), ("KV sharing", kv_sharing_target_layer_name),
                        ("attention sinks", sinks is not None or None)):
        if value:
            reasons.append(f"{what} ({value!r}) is not supported")
    if reasons:
        raise AttentionConfigError(f"Ascend attention backend ASCEND_ENCODER_ONLY cannot serve this layer: "
                                   f"{'; '.join(reasons)}")
