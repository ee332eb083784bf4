"""`simulated.startup_gc`: the worker heap is collected, then frozen, so vLLM's start-up collections skip it."""

from __future__ import annotations

import gc
import weakref

import pytest

from ascend_platform.simulated.startup_gc import freeze_startup_heap


class _Node:
    pass


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_garbage_is_collected_before_the_freeze(unfrozen):
    cycle = _Node()
    cycle.self = cycle
    gone = weakref.ref(cycle)
    del cycle
    frozen = freeze_startup_heap()
    assert gone() is None  # a cycle that was garbage is not kept alive by the freeze
    assert frozen == gc.get_freeze_count() > 0


def test_later_collections_skip_the_frozen_heap_but_still_collect_new_garbage(unfrozen):
    survivor = _Node()
    freeze_startup_heap()
    tracked = len(gc.get_objects())
    assert tracked < gc.get_freeze_count()  # the collector now walks far fewer objects than it froze
    assert not any(o is survivor for o in gc.get_objects())
    cycle = _Node()
    cycle.self = cycle
    gone = weakref.ref(cycle)
    del cycle
    gc.collect()
    assert gone() is None
