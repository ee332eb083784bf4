"""Composing the Ascend routed experts with a model's own `RoutedExperts` subclass (no engine: the classes only)."""

from __future__ import annotations

import pytest
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

from ascend_platform.moe.routed_experts import AscendRoutedExperts, AscendRoutedExpertsMixin, ascend_composition


class CustomLoaderExperts(RoutedExperts):
    marker = "custom"

    def weight_loader(self, *args, **kwargs):  # what a model's subclass brings (upstream 52209)
        return "loaded by the subclass"


class OwnForwardExperts(RoutedExperts):
    def forward_monolithic(self, x, router_logits=None, input_ids=None):
        return x


def test_the_plain_layer_is_the_composition_of_routed_experts():
    assert AscendRoutedExperts.__name__ == "AscendRoutedExperts"
    assert AscendRoutedExperts.__mro__[1:3] == (AscendRoutedExpertsMixin, RoutedExperts)
    assert ascend_composition(RoutedExperts) is AscendRoutedExperts  # one class per composed class


def test_a_subclass_keeps_its_loader_and_attributes_and_gains_our_forward():
    composed = ascend_composition(CustomLoaderExperts)
    assert composed.__mro__[1:3] == (AscendRoutedExpertsMixin, CustomLoaderExperts)
    assert composed.weight_loader is CustomLoaderExperts.weight_loader and composed.marker == "custom"
    assert composed.forward_monolithic is AscendRoutedExpertsMixin.forward_monolithic
    assert issubclass(composed, RoutedExperts) and ascend_composition(composed) is composed


def test_a_subclass_with_its_own_forward_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="OwnForwardExperts overrides forward_monolithic"):
        ascend_composition(OwnForwardExperts)
    with pytest.raises(TypeError, match="not a vLLM RoutedExperts"):
        ascend_composition(dict)


class _ForeignMoEMethod(FusedMoEMethodBase):
    """A quantization config's MoE method that is not the platform's (e.g. vLLM's CUDA fp8 experts)."""

    def create_weights(self, *args, **kwargs) -> None:
        raise AssertionError("a refused method builds nothing")

    def get_fused_moe_quant_config(self, layer) -> None:
        return None


class _QuantConfig:
    online_quantization_config = None

    def get_name(self) -> str:
        return "fp8"

    def get_quant_method(self, layer, prefix):
        return object.__new__(_ForeignMoEMethod)


def test_a_quantized_plain_layer_is_refused_naming_the_layer_and_method():
    """The platform runs its own MoE methods only (AscendMoEMethod, the quantized AscendQuantMoEMethod): any other
    method a quantization config picks for the experts is refused naming the layer, the method and the config."""
    with pytest.raises(NotImplementedError, match=r"model.layers.0.mlp.experts: the Ascend routed experts do not run "
                                                  r"_ForeignMoEMethod \('fp8' experts\)"):
        AscendRoutedExperts._get_quant_method(object.__new__(AscendRoutedExperts), "model.layers.0.mlp.experts",
                                              _QuantConfig(), None)
