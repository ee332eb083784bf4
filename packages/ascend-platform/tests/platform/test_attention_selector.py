"""Attention backend selection keyed on (use_mla, use_sparse, compressed), with the 310P override."""

from __future__ import annotations

import pytest

from ascend_platform.attention.selector import (
    ATTENTION_310P_BACKEND,
    ATTENTION_BACKEND,
    BACKENDS,
    AttentionChoice,
    select_attention_backend,
)


def test_standard_attention_gets_the_ascend_backend_and_it_imports():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    path = select_attention_backend(AttentionChoice(False, False, False, is_310p=False))
    assert path == ATTENTION_BACKEND
    backend = resolve_obj_by_qualname(path)
    assert backend.get_name() == "ASCEND" and not backend.forward_includes_kv_cache_update


def test_310p_overrides_the_table():
    assert select_attention_backend(AttentionChoice(False, False, False, is_310p=True)) == ATTENTION_310P_BACKEND
    with pytest.raises(NotImplementedError, match="310P"):
        select_attention_backend(AttentionChoice(True, False, False, is_310p=True))


@pytest.mark.parametrize("key", [k for k, v in BACKENDS.items() if v is None])
def test_unbuilt_backends_fail_naming_the_combination(key):
    with pytest.raises(NotImplementedError, match=f"use_mla={key[0]}, use_sparse={key[1]}"):
        select_attention_backend(AttentionChoice(*key, is_310p=False))


def test_every_key_is_covered():
    keys = {(m, s, c) for m in (False, True) for s in (False, True) for c in (False, True)}
    for key in keys - set(BACKENDS):
        with pytest.raises(ValueError, match="no Ascend attention backend"):
            select_attention_backend(AttentionChoice(*key, is_310p=False))


def test_mla_gets_the_ascend_mla_backend_and_it_imports():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from ascend_platform.attention.selector import MLA_BACKEND

    path = select_attention_backend(AttentionChoice(True, False, False, is_310p=False))
    assert path == MLA_BACKEND
    backend = resolve_obj_by_qualname(path)
    assert backend.get_name() == "ASCEND_MLA" and backend.is_mla()


def _request(**kw):
    import torch

    from ascend_platform.attention.validation import AttentionRequest

    base = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=128, latent_size=576)
    return AttentionRequest(**(base | kw))


def test_a_servable_mla_model_passes_validation():
    choice = AttentionChoice(True, False, False, is_310p=False)
    assert select_attention_backend(choice, _request()).endswith("AscendMLABackend")


@pytest.mark.parametrize(("bad", "named"), [
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype 'fp8' is not supported"),
    (dict(block_size=24), "block_size 24 is not a multiple of 16"),
    (dict(dcp_size=2), "decode context parallel (DCP) size 2 is not supported"),
    (dict(pcp_size=2), "prefill context parallel (PCP) size 2 is not supported"),
    (dict(head_size=96), "head size 96 is not the model's latent size"),
])
def test_an_unservable_mla_model_fails_naming_why(bad, named):
    from ascend_platform.attention.validation import AttentionConfigError

    with pytest.raises(AttentionConfigError, match="ASCEND_MLA cannot serve this model") as err:
        select_attention_backend(AttentionChoice(True, False, False, is_310p=False), _request(**bad))
    assert named in str(err.value)


def test_mla_impl_refuses_what_it_cannot_compute():
    from ascend_platform.attention.validation import AttentionConfigError, check_mla_impl_args

    args = dict(alibi_slopes=None, sliding_window=None, logits_soft_cap=None, attn_type="decoder",
                kv_sharing_target_layer_name=None, kv_cache_dtype="auto", dcp_world_size=1, pcp_world_size=1,
                head_size=576, kv_lora_rank=512, qk_rope_head_dim=64)
    check_mla_impl_args(**args)
    with pytest.raises(AttentionConfigError, match="a sliding window"):
        check_mla_impl_args(**(args | dict(sliding_window=128)))
    with pytest.raises(AttentionConfigError, match="decode context parallel"):
        check_mla_impl_args(**(args | dict(dcp_world_size=2)))
