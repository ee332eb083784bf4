"""Layers the Ascend allocator lays out as dense planes move as one region per plane, never as whole cells."""

from __future__ import annotations

import torch

from ascend_core.kv import planes as kv_planes
from ascend_kv_transfer.kv_regions import describe_kv_caches
from ascend_kv_transfer.pool.block_layout import BlockLayout


def _planar_mla(blocks=6, block_size=16, latent=8, rope=4):
    split = kv_planes.PlaneSplit(("latent", "rope"), (latent, rope))
    geometry = kv_planes.plane_geometry(split, blocks, block_size, 1, torch.float32)
    region = torch.zeros(geometry.elements)
    bound = kv_planes.bound_view(region, geometry, (blocks, 1, block_size, latent + rope))
    return bound, geometry


def test_a_planar_layer_is_one_region_per_plane_and_a_plain_layer_one():
    bound, geometry = _planar_mla()
    plain = torch.zeros(6, 16, 2, 8)
    kv_planes.publish({"mla": (bound.data_ptr(), geometry)})
    try:
        regions = describe_kv_caches({"mla": bound, "plain": plain}, num_blocks=6, groups={"mla": 0, "plain": 1})
    finally:
        kv_planes.publish({})
    by_name = {r.name: r for r in regions.regions}
    assert list(by_name) == ["mla#latent", "mla#rope", "plain"]
    latent, rope = by_name["mla#latent"], by_name["mla#rope"]
    assert (latent.base_addr, latent.page_bytes, latent.block_stride) == (bound.data_ptr(), 16 * 8 * 4, 16 * 8 * 4)
    assert rope.base_addr == bound.data_ptr() + 6 * 16 * 8 * 4 and rope.page_bytes == rope.block_stride == 16 * 4 * 4
    assert latent.owner == rope.owner == "mla" and by_name["plain"].owner == "plain" and rope.group == 0
    # one storage: the planes are back to back; a block's bytes are its latent page and its rope page
    assert [(s.addr, s.nbytes) for s in regions.storages if s.addr == bound.data_ptr()] == \
        [(bound.data_ptr(), bound.numel() * 4)]
    layout = BlockLayout(regions.regions, {0: ["mla"]})
    addrs, sizes = layout.buffers(0, 2)
    assert addrs == [latent.base_addr + 2 * latent.block_stride, rope.base_addr + 2 * rope.block_stride]
    assert sizes == [latent.page_bytes, rope.page_bytes]


def test_without_a_published_plane_table_the_same_tensor_is_whole_cells():
    bound, _ = _planar_mla()
    kv_planes.publish({})
    (region,) = describe_kv_caches({"mla": bound}, num_blocks=6).regions
    assert region.name == "mla" and region.page_bytes == 16 * 12 * 4
