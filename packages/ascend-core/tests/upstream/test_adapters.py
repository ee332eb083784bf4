"""Lane adapters against the installed vLLM's own classes: the current lane's (0.32.0) in the default environment,
the legacy lane's (0.27.1: `KVCacheTensor.shared_by`, `MLAAttentionSpec.compress_ratio`) in the release-lane
environment, where scripts/test-all runs this suite too. A test of the other lane's class skips."""

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

_TENSOR_FIELDS = {f.name for f in dataclasses.fields(KVCacheTensor)}
_MLA_FIELDS = {f.name for f in dataclasses.fields(MLAAttentionSpec)}
current_descriptors = pytest.mark.skipif("layers" not in _TENSOR_FIELDS,
                                         reason="this vLLM's KVCacheTensor is the legacy lane's (shared_by)")
legacy_descriptors = pytest.mark.skipif("shared_by" not in _TENSOR_FIELDS,
                                        reason="the legacy KVCacheTensor (shared_by) runs in the release lane, 0.27.1")
current_mla = pytest.mark.skipif("tokens_per_state" not in _MLA_FIELDS,
                                 reason="this vLLM's MLAAttentionSpec is the legacy lane's (compress_ratio)")
legacy_mla = pytest.mark.skipif("compress_ratio" not in _MLA_FIELDS,
                                reason="the legacy MLAAttentionSpec (compress_ratio) runs in the release lane, 0.27.1")


@dataclasses.dataclass
class OldestKVCacheTensor:  # <= 0.23 (no lane runs it any more): no offset either
    size: int
    shared_by: list[str]


@current_descriptors
def test_current_lane_descriptor_round_trip():
    t = make_kv_tensor(4096, ["a", "b"], layer_stride=2048, block_stride=128, offset=0)
    assert isinstance(t, KVCacheTensor)
    assert kv_tensor_layers(t) == ["a", "b"]
    assert kv_tensor_geometry(t) == (0, 2048, 128)


@legacy_descriptors
def test_legacy_lane_descriptor_round_trip():
    t = make_kv_tensor(4096, ["a", "b"], block_stride=128, cls=KVCacheTensor)
    assert make_kv_tensor(4096, ["a", "b"], block_stride=128).shared_by == ["a", "b"]  # the installed class
    assert t.shared_by == ["a", "b"]
    assert kv_tensor_layers(t) == ["a", "b"]
    assert kv_tensor_geometry(t) == (0, 0, 128)


@legacy_descriptors
def test_legacy_lane_rejects_geometry_it_cannot_express():
    with pytest.raises(ValueError, match="layer_stride"):
        make_kv_tensor(4096, ["a", "b"], layer_stride=2048, cls=KVCacheTensor)
    with pytest.raises(ValueError, match="offset"):
        make_kv_tensor(4096, ["a"], offset=64, cls=OldestKVCacheTensor)


def test_descriptor_without_layer_field_is_a_type_error_naming_both_fields():
    @dataclasses.dataclass
    class Broken:
        size: int

    with pytest.raises(TypeError, match="'layers' nor 'shared_by'"):
        kv_tensor_layers(Broken(1))


@current_mla
def test_mla_ratio_current_lane():
    spec = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=576, dtype=__import__("torch").bfloat16,
                            **mla_ratio_kwargs(4, MLAAttentionSpec))
    assert mla_ratio(spec) == 4
    assert mla_ratio_kwargs(4, MLAAttentionSpec) == {"tokens_per_state": 4}


@legacy_mla
def test_mla_ratio_legacy_lane():
    spec = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=576, dtype=__import__("torch").bfloat16,
                            **mla_ratio_kwargs(4, MLAAttentionSpec))
    assert spec.compress_ratio == 4 and mla_ratio(spec) == 4
    assert mla_ratio_kwargs(4, MLAAttentionSpec) == {"compress_ratio": 4}
    with pytest.raises(ValueError, match=">= 1"):
        mla_ratio_kwargs(0, MLAAttentionSpec)


def test_speculator_dp_arg_for_each_lane():
    installed = speculator_dp_arg()  # dp_sync_state on 0.32.0, num_tokens_across_dp on 0.27.1
    assert installed in ("dp_sync_state", "num_tokens_across_dp")
    assert installed in inspect.signature(BaseSpeculator.propose).parameters
    assert speculator_dp_kwargs(7) == {installed: 7}

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


def test_refusals_name_exactly_the_hooks_the_installed_vllm_lacks():
    """On each lane, against vLLM's own classes: a refusal is given exactly where a hook is missing, naming it."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backend import AttentionBackend

    from ascend_core.upstream import connector_kv_manager_unavailable_reason, mla_hooks_unavailable_reason

    mla = mla_hooks_unavailable_reason()
    hooks = {"Platform.get_mla_prefill_backend_cls": hasattr(Platform, "get_mla_prefill_backend_cls"),
             "AttentionBackend.customize_spec": hasattr(AttentionBackend, "customize_spec")}
    lacking = [name for name, present in hooks.items() if not present]
    assert (mla is None) == (not lacking) and all(n in (mla or "") for n in lacking), (mla, lacking)
    manager = connector_kv_manager_unavailable_reason()
    assert (manager is None) == hasattr(KVConnectorBase_V1, "bind_kv_cache_manager")
    assert manager is None or "bind_kv_cache_manager" in manager
