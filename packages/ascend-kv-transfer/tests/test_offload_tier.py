"""The host tier: LRU byte budget with pins, and byte-exact zero-copy store/load."""

import pytest
import torch

from ascend_kv_transfer.offload.host_tier import HostTier, block_byte_view
from ascend_kv_transfer.offload.lru import HostTierIndex


def test_budget_sets_the_slot_count():
    assert HostTierIndex(10_000, 1000).num_slots == 10
    with pytest.raises(ValueError, match="host_bytes"):
        HostTierIndex(10, 1000)


def test_lru_evicts_oldest_unpinned():
    idx = HostTierIndex(3000, 1000)
    slots = [idx.allocate(k) for k in "abc"]
    assert sorted(slots) == [0, 1, 2] and idx.used_bytes == 3000
    idx.slots_for(["a"])  # a becomes most recent: b is now the oldest
    idx.pin(idx.slots_for(["b"]))
    s = idx.allocate("d")  # b pinned, c oldest unpinned
    assert "c" not in idx and "b" in idx and "a" in idx and idx.evictions == 1
    assert s == slots[2]
    idx.pin(idx.slots_for(["a", "d"]))
    assert idx.allocate("e") is None  # everything pinned
    idx.unpin(idx.slots_for(["a", "b", "d"]))
    assert idx.allocate("e") is not None


def test_prefix_lookup_stops_at_first_miss():
    idx = HostTierIndex(10_000, 1000)
    for k in ("h0", "h1", "h3"):
        idx.allocate(k)
    assert idx.lookup_prefix(["h0", "h1", "h2", "h3"]) == 2
    assert idx.lookup_prefix(["h9"]) == 0


def test_byte_view_aliases_the_cache():
    t = torch.zeros(4, 2, 8)
    view = block_byte_view(t, 64, 64, 4)
    assert view.shape == (4, 64) and view.data_ptr() == t.data_ptr()
    view[1].fill_(1)
    assert t[1].view(torch.uint8).eq(1).all() and t[0].eq(0).all()


def test_store_then_load_restores_exact_bytes():
    torch.manual_seed(0)
    raw = torch.randn(2 * 16 * 32)
    caches = {f"l{i}": raw[i * 16 * 32:(i + 1) * 16 * 32].view(16, 32) for i in range(2)}
    tier = HostTier(caches, num_slots=8)
    before = raw.clone()
    moved = tier.store([3, 4, 5, 0], [2, 3, 4, 9])
    assert moved == 4 * 2 * 32 * 4
    assert tier.copies == 2 * 2  # two runs (2-4 and 9) per layer
    raw.zero_()
    tier.load([3, 4, 5, 0], [10, 11, 12, 1])
    for name, t in caches.items():
        i = int(name[1:])
        ref = before[i * 16 * 32:(i + 1) * 16 * 32].view(16, 32)
        assert torch.equal(t[10:13], ref[2:5]) and torch.equal(t[1], ref[9])
        assert t[0].eq(0).all()


def test_separate_layer_buffers_copy_per_layer_and_run():
    caches = {"a": torch.randn(6, 16), "b": torch.randn(6, 16)}
    ref = {k: v.clone() for k, v in caches.items()}
    tier = HostTier(caches, num_slots=4)
    tier.store([0, 1, 3], [4, 5, 0])
    assert tier.copies == 2 * 2
    for t in caches.values():
        t.zero_()
    tier.load([0, 1, 3], [0, 1, 2])
    for k, t in caches.items():
        assert torch.equal(t[0:2], ref[k][4:6]) and torch.equal(t[2], ref[k][0])


def test_block_major_layers_move_page_by_page():
    """Layers interleaved per block (a block holds every layer's page): a run is not one piece per layer."""
    torch.manual_seed(1)
    raw = torch.randn(8, 3, 32)  # [blocks, layers, page floats]
    caches = {f"l{i}": raw[:, i] for i in range(3)}
    assert caches["l0"].stride(0) == 3 * 32
    before = raw.clone()
    tier = HostTier(caches, num_slots=4)
    assert tier.store([0, 1, 2], [5, 6, 7]) == 3 * 3 * 32 * 4
    raw.zero_()
    tier.load([0, 1, 2], [1, 2, 3])
    assert torch.equal(raw[1:4], before[5:8])
    assert raw[0].eq(0).all() and raw[4:].eq(0).all()
