"""Which Ascend backend an attention layer gets by its attention type, and what is refused by name (no engine)."""

from __future__ import annotations

import pytest
import torch

from ascend_platform.attention.selector import (
    ATTENTION_310P_BACKEND,
    ATTENTION_BACKEND,
    ENCODER_ONLY_BACKEND,
    AttentionChoice,
    select_attention_backend,
)
from ascend_platform.attention.validation import (
    AttentionConfigError,
    AttentionRequest,
    attn_type_name,
    check_encoder_only_impl_args,
)

DENSE = AttentionChoice(use_mla=False, use_sparse=False, compressed=False, is_310p=False)


def _request(attn_type, **kw) -> AttentionRequest:
    base = dict(head_size=32, dtype=torch.float32, kv_cache_dtype="auto", block_size=32)
    return AttentionRequest(**(base | kw), attn_type=attn_type_name(attn_type))


def test_the_attention_type_is_read_from_vllms_enum():
    from vllm.v1.attention.backend import AttentionType

    assert attn_type_name(AttentionType.ENCODER_ONLY) == "encoder_only"
    assert attn_type_name("decoder") == "decoder"


def test_encoder_only_layers_get_the_encoder_only_backend_and_it_imports():
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backend import AttentionType

    path = select_attention_backend(DENSE, _request(AttentionType.ENCODER_ONLY))
    assert path == ENCODER_ONLY_BACKEND
    backend = resolve_obj_by_qualname(path)
    assert backend.get_name() == "ASCEND_ENCODER_ONLY"
    assert backend.supports_attn_type(AttentionType.ENCODER_ONLY)
    assert not backend.supports_attn_type(AttentionType.DECODER)
    # the 310P card's private KV buffers do not matter to a layer that keeps no KV
    path_310p = select_attention_backend(
        AttentionChoice(False, False, False, is_310p=True), _request(AttentionType.ENCODER_ONLY)
    )
    assert path_310p == ENCODER_ONLY_BACKEND


def test_decoder_layers_keep_their_backends():
    assert select_attention_backend(DENSE, _request("decoder")) == ATTENTION_BACKEND
    assert (
        select_attention_backend(AttentionChoice(False, False, False, is_310p=True), _request("decoder"))
        == ATTENTION_310P_BACKEND
    )


@pytest.mark.parametrize(
    ("attn_type", "named"),
    [("encoder_decoder", "cross-attention"), ("encoder", "encoder attention of an encoder-decoder model")],
)
def test_encoder_decoder_attention_is_refused_by_name(attn_type, named):
    with pytest.raises(AttentionConfigError, match=f"ASCEND cannot serve this model: {named}"):
        select_attention_backend(DENSE, _request(attn_type))


def test_an_encoder_only_request_on_a_latent_backend_is_refused():
    with pytest.raises(AttentionConfigError, match="ASCEND_MLA.*attention type 'encoder_only' is not served"):
        select_attention_backend(
            AttentionChoice(True, False, False, is_310p=False), _request("encoder_only", head_size=576, latent_size=576)
        )


@pytest.mark.parametrize(
    ("arg", "value", "named"),
    [
        ("sliding_window", 9, "sliding window"),
        ("alibi_slopes", [0.5, 0.25], "ALiBi"),
        ("logits_soft_cap", 30.0, "logits_soft_cap"),
    ],
)
def test_what_the_dense_non_causal_op_cannot_do_is_refused_when_the_layer_is_built(arg, value, named):
    args = dict(
        attn_type="encoder_only",
        alibi_slopes=None,
        sliding_window=None,
        logits_soft_cap=None,
        kv_sharing_target_layer_name=None,
        sinks=None,
    ) | {arg: value}
    with pytest.raises(AttentionConfigError, match=f"ASCEND_ENCODER_ONLY cannot serve this layer: .*{named}"):
        check_encoder_only_impl_args(**args)
    check_encoder_only_impl_args(**(args | {arg: None}))
