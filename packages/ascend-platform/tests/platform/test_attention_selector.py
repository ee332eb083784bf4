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
