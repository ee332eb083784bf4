"""The entry point registers every connector once; each class speaks vLLM's connector API with HMA support."""

import importlib

import pytest

from ascend_kv_transfer import registration


def test_register_is_idempotent():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    registration.register()
    assert registration.register() == []
    for name in registration.CONNECTORS:
        assert name in KVConnectorFactory._registry


@pytest.mark.parametrize("name", sorted(registration.CONNECTORS))
def test_connector_classes_implement_the_api(name):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, supports_hma

    module, cls_name = registration.CONNECTORS[name]
    cls = getattr(importlib.import_module(module), cls_name)
    assert cls.__name__ == name and issubclass(cls, KVConnectorBase_V1) and supports_hma(cls)
    assert not getattr(cls, "__abstractmethods__", None)
    registration.register()
    assert KVConnectorFactory.get_connector_class_by_name(name) is cls
