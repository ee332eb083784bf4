"""Lane adapters: the current lane against the installed vLLM, the legacy lane with stand-ins shaped like <= 0.28."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from vllm.v1.kv_cache_interface import KVCacheTensor, MLAAttentionSpec
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from ascend_core.upstream import (
    kv_tensor_geometry,
    kv_tensor_layers,
    make_kv_tensor,
    mla_ratio,
    mla_ratio_kwargs,
    pop_speculator_dp,
    speculator_dp_arg,
    speculator_dp_kwargs,
)


# Shaped like vllm 0.28's classes (read from the published 0.28.0 wheel).
@dataclasses.dataclass
class LegacyKVCacheTensor:
    size: int
    shared_by: list[str]
    offset: int = 0
    block_stride: int = 0


@dataclasses.dataclass
class OldestKVCacheTensor:  # <= 0.23: no offset either
    size: int
    shared_by: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LegacyMLASpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    compress_ratio: int = 1


def test_current_lane_descriptor_round_trip():
    t = make_kv_tensor(4096, ["a", "b"], layer_stride=2048, block_stride=128, offset=0)
    assert isinstance(t, KVCacheTensor)
    assert kv_tensor_layers(t) == ["a", "b"]
    assert kv_tensor_geometry(t) == (0, 2048, 128)


def test_legacy_lane_descriptor_round_trip():
    t = make_kv_tensor(4096, ["a", "b"], block_stride=128, cls=LegacyKVCacheTensor)
    assert t.shared_by == ["a", "b"]
    assert kv_tensor_layers(t) == ["a", "b"]
    assert kv_tensor_geometry(t) == (0, 0, 128)


def test_legacy_lane_rejects_geometry_it_cannot_express():
    with pytest.raises(ValueError, match="layer_stride"):
        make_kv_tensor(4096, ["a", "b"], layer_stride=2048, cls=LegacyKVCacheTensor)
    with pytest.raises(ValueError, match="offset"):
        make_kv_tensor(4096, ["a"], offset=64, cls=OldestKVCacheTensor)


def test_descriptor_without_layer_field_is_a_type_error_naming_both_fields():
    @dataclasses.dataclass
    class Broken:
        size: int

    with pytest.raises(TypeError, match="'layers' nor 'shared_by'"):
        kv_tensor_layers(Broken(1))


def test_mla_ratio_current_lane():
    spec = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=576, dtype=__import__("torch").bfloat16,
                            **mla_ratio_kwargs(4, MLAAttentionSpec))
    assert mla_ratio(spec) == 4
    assert mla_ratio_kwargs(4, MLAAttentionSpec) == {"tokens_per_state": 4}


def test_mla_ratio_legacy_lane():
    spec = LegacyMLASpec(block_size=128, num_kv_heads=1, head_size=576, **mla_ratio_kwargs(4, LegacyMLASpec))
    assert spec.compress_ratio == 4 and mla_ratio(spec) == 4
    with pytest.raises(ValueError, match=">= 1"):
        mla_ratio_kwargs(0, LegacyMLASpec)


def test_speculator_dp_arg_for_each_lane():
    assert speculator_dp_arg() == "dp_sync_state"
    assert "dp_sync_state" in inspect.signature(BaseSpeculator.propose).parameters

    def legacy(self, x, num_tokens_across_dp=None): ...
    def mid(self, x, dp_sync=None): ...
    def neither(self, x): ...

    assert speculator_dp_kwargs(7, legacy) == {"num_tokens_across_dp": 7}
    assert speculator_dp_kwargs(7, mid) == {"dp_sync": 7}
    assert speculator_dp_kwargs(7, neither) == {}


def test_pop_speculator_dp_accepts_any_lane_and_rejects_two():
    for name in ("num_tokens_across_dp", "dp_sync", "dp_sync_state"):
        kwargs = {name: 3, "other": 1}
        assert pop_speculator_dp(kwargs) == 3 and kwargs == {"other": 1}
    assert pop_speculator_dp({}) is None
    with pytest.raises(TypeError, match="several"):
        pop_speculator_dp({"dp_sync": 1, "dp_sync_state": 2})


def test_planner_function_finds_the_installed_planner():
    from vllm.v1.core import kv_cache_utils

    from ascend_core.upstream import planner_function

    assert planner_function("get_kv_cache_groups") is kv_cache_utils.get_kv_cache_groups
    with pytest.raises(AttributeError, match="no_such_planner_fn"):
        planner_function("no_such_planner_fn")
