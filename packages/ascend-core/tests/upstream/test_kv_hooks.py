"""KV adapters for hooks whose presence differs by release: connector sleep hook, backend layout declarations."""

from __future__ import annotations

import pytest

from ascend_core.upstream import capabilities, kv_cache_layouts, unregister_connector_kv_caches


class ConnectorWithHook:
    def __init__(self) -> None:
        self.released = 0

    def unregister_kv_caches(self) -> None:
        self.released += 1


class ConnectorWithoutHook:
    pass


def test_a_connector_that_has_the_sleep_hook_is_told():
    connector = ConnectorWithHook()
    assert unregister_connector_kv_caches(connector) is True and connector.released == 1


@pytest.mark.skipif(capabilities().connector_unregister_kv_caches, reason="every connector has the upstream hook")
def test_a_connector_without_the_hook_is_left_alone_before_upstream_has_it():
    assert unregister_connector_kv_caches(ConnectorWithoutHook()) is False


@pytest.mark.skipif(not capabilities().has_kv_cache_layout,
                    reason="the legacy lane (0.27.1) has no vllm.v1.kv_cache_layout: backends shape KV themselves")
def test_layouts_by_name_on_a_release_with_standardized_layouts():
    from vllm.v1.kv_cache_layout import KVCacheLayout

    assert kv_cache_layouts(("LBNHC", "LBHNC")) == (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)
    with pytest.raises(ValueError, match="'NOPE'"):
        kv_cache_layouts(("NOPE",))
