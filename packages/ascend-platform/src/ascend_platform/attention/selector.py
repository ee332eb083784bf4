"""Which Ascend attention backend a layer gets, keyed on (use_mla, use_sparse, compressed), with the 310P override;
an encoder-only layer (BERT-style embedding models) gets the encoder-only backend, which holds no KV cache.

Kept free of vLLM imports so the table is testable on its own; `NPUPlatform.get_attn_backend_cls` calls
`select_attention_backend`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_platform.attention.validation import ENCODER_ONLY, AttentionRequest, check_backend

_PKG = "ascend_platform.attention"

ATTENTION_BACKEND = f"{_PKG}.backend.AscendAttentionBackend"
ATTENTION_310P_BACKEND = f"{_PKG}.backend.Ascend310PAttentionBackend"
MLA_BACKEND = f"{_PKG}.mla_backend.AscendMLABackend"
SFA_BACKEND = f"{_PKG}.sfa_backend.AscendSFABackend"
ENCODER_ONLY_BACKEND = f"{_PKG}.encoder_backend.AscendEncoderOnlyAttentionBackend"
# DeepSeek V4's layers name their backends themselves (vLLM's V4 model never asks the platform); this is the one its
# compressed sparse layers name, built on by `ascend_platform.models.deepseek_v4`.
DSA_BACKEND = "ascend_platform.models.deepseek_v4.backends.AscendDSABackend"

# (use_mla, use_sparse, compressed) -> backend class path, or None where the backend is not built yet.
BACKENDS: dict[tuple[bool, bool, bool], str | None] = {
    (False, False, False): ATTENTION_BACKEND,
    (True, False, False): MLA_BACKEND,
    (True, True, False): SFA_BACKEND,  # SFA: sparse flash attention (DeepSeek V3.2)
    (True, True, True): DSA_BACKEND,  # DSA with the compressed indexer cache (DeepSeek V4)
    (True, False, True): None,  # compressed MLA
}
NAMES = {
    (False, False, False): "ASCEND",
    (True, False, False): "ASCEND_MLA",
    (True, True, False): "ASCEND_SFA",
    (True, True, True): "ASCEND_DSA",
    (True, False, True): "ASCEND_MLA_COMPRESSED",
}


@dataclass(frozen=True)
class AttentionChoice:
    use_mla: bool
    use_sparse: bool
    compressed: bool
    is_310p: bool

    @property
    def key(self) -> tuple[bool, bool, bool]:
        return (self.use_mla, self.use_sparse, self.compressed)


def register_backend_names() -> None:
    """Give vLLM's `AttentionBackendEnum` our backends' names (layers look their backend up by `get_name()`)."""
    from ascend_core.upstream import register_attention_backend

    for name, path in (("ASCEND", ATTENTION_BACKEND), ("ASCEND_310P", ATTENTION_310P_BACKEND),
                       ("ASCEND_MLA", MLA_BACKEND), ("ASCEND_SFA", SFA_BACKEND), ("ASCEND_DSA", DSA_BACKEND),
                       ("ASCEND_ENCODER_ONLY", ENCODER_ONLY_BACKEND)):
        register_attention_backend(name, path)


def _encoder_only(choice: AttentionChoice, request: AttentionRequest | None) -> bool:
    # MLA/sparse encoder-only layers do not exist; were one to ask, the latent backends refuse it by attention type.
    return request is not None and request.attn_type == ENCODER_ONLY and choice.key == (False, False, False)


def backend_name(choice: AttentionChoice, request: AttentionRequest | None = None) -> str:
    if _encoder_only(choice, request):
        return "ASCEND_ENCODER_ONLY"
    return "ASCEND_310P" if choice.is_310p else NAMES.get(choice.key, "?")


def select_attention_backend(choice: AttentionChoice, request: AttentionRequest | None = None) -> str:
    """The backend class path for `choice`, checked against `request` when given (`AttentionConfigError` naming
    every reason it cannot serve it, e.g. an attention type no Ascend backend serves); a clear error for
    combinations we do not serve."""
    path = ENCODER_ONLY_BACKEND if _encoder_only(choice, request) else _path(choice)
    if request is not None:
        check_backend(backend_name(choice, request), request)
    return path


def _path(choice: AttentionChoice) -> str:
    if choice.is_310p:
        if choice.use_mla or choice.use_sparse:
            raise NotImplementedError("310P serves standard attention only (no MLA/sparse attention on 310P)")
        return ATTENTION_310P_BACKEND
    if choice.key not in BACKENDS:
        raise ValueError(f"no Ascend attention backend for use_mla={choice.use_mla}, use_sparse={choice.use_sparse}, "
                         f"compressed={choice.compressed}")
    path = BACKENDS[choice.key]
    if path is None:
        raise NotImplementedError(f"Ascend attention backend {NAMES[choice.key]} (use_mla={choice.use_mla}, "
                                  f"use_sparse={choice.use_sparse}, compressed={choice.compressed}) is not built yet")
    return path
