"""The device KV layout: layers whose backend declares planes get dense K/V (or latent/rope) caches.

On configs from vLLM's own planner: each plane is one contiguous cache of the logical shape (what torch_npu's paged
kernels take), the tensor vLLM binds to the layer gives the same planes to the attention impls and to KV connectors
(`planes_of`), every (layer, block) plane row is written through the planes without touching another page of its
group, and the allocation costs exactly the bytes and blocks it costs packed.
"""

from __future__ import annotations

import pytest
import torch

from ascend_core.kv import planes as kv_planes
from ascend_core.kv.allocator import allocate_kv_caches
from ascend_core.kv.errors import KVLayoutError
from ascend_core.kv.specs import AscendMLAAttentionSpec, AscendSparseIndexerSpec
from ascend_core.kv.views import MLAKV, AttentionKV, attention_kv_of, mla_kv_of


def _sfa_like():
    """DeepSeek-V3.2-like: a bf16 MLA latent per layer beside its fp8 indexer key cache (mixed page sizes)."""
    specs = {}
    for i in range(2):
        specs[f"model.layers.{i}.self_attn.attn"] = AscendMLAAttentionSpec.create(
            block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, rope_head_dim=64)
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = AscendSparseIndexerSpec.create(
            block_size=64, num_kv_heads=1, head_size=128, dtype=torch.uint8, scale_dim=1,
            scale_dtype=torch.float32)
    return specs, 1 << 20, None


def _declared(specs):
    out = {}
    for name, spec in specs.items():
        if isinstance(spec, AscendSparseIndexerSpec):
            continue  # its backend declares no planes: the indexer's ops read packed fp8 records
        if isinstance(spec, AscendMLAAttentionSpec):
            out[name] = kv_planes.mla_planes(spec, spec.rope_head_dim)
        else:
            out[name] = kv_planes.attention_planes(spec)
    return out


CASES = ("dense_gqa", "sliding_window_hybrid", "mla_ratio1", "eagle_draft", "sfa_like")


def _case(kv_cases, case):
    return _sfa_like() if case == "sfa_like" else kv_cases[case]()


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
@pytest.mark.parametrize("case", CASES)
def test_planar_layers_get_dense_caches_at_packed_cost(plan, kv_cases, case, layout):
    specs, memory, eagle = _case(kv_cases, case)
    config = plan(specs, memory, layout, eagle_layer=eagle)
    declared = _declared(specs)
    packed = allocate_kv_caches(config, device="cpu")
    alloc = allocate_kv_caches(config, device="cpu", planes=declared)
    assert alloc.nbytes == packed.nbytes and alloc.num_blocks == packed.num_blocks == config.num_blocks
    assert set(alloc.planar) == set(declared)
    bound = alloc.as_vllm_kv_caches()
    for name, split in declared.items():
        spec, kv = specs[name], alloc.layers[name]
        states = spec.storage_block_size if hasattr(spec, "storage_block_size") else spec.block_size
        for plane, width in zip(vars(kv).values(), split.widths, strict=False):
            assert plane.is_contiguous() and plane.shape == (config.num_blocks, states, plane.shape[2], width)
        if isinstance(kv, AttentionKV):
            again = attention_kv_of(bound[name], spec.head_size)
            assert bound[name].shape == (2, config.num_blocks, states, spec.num_kv_heads, spec.head_size)
            pairs = ((kv.key, again.key), (kv.value, again.value))
        else:
            assert isinstance(kv, MLAKV)
            again = mla_kv_of(bound[name], split.widths[0])
            pairs = ((kv.latent, again.latent), (kv.rope, again.rope))
        for a, b in pairs:
            assert (a.shape, a.stride(), a.data_ptr()) == (b.shape, b.stride(), b.data_ptr())
        found = kv_planes.planes_of(name, bound[name])
        assert [p.data_ptr() for _, p in found] == [a.data_ptr() for a, _ in pairs]
        assert [part for part, _ in found] == list(split.names)


@pytest.mark.parametrize("case", CASES)
def test_every_plane_row_belongs_to_one_block_of_one_layer(plan, kv_cases, case):
    """Tag each (layer, block) through its planes, group by group (a block id belongs to one group at a time, as
    vLLM's hybrid manager hands them out): every tag reads back, so no two pages of a group share bytes."""
    specs, memory, eagle = _case(kv_cases, case)
    config = plan(specs, memory, "LBNHC", eagle_layer=eagle)
    alloc = allocate_kv_caches(config, device="cpu", planes=_declared(specs))
    for group in config.kv_cache_groups:
        names = [n for n in group.layer_names if n in alloc.planar]
        for i, name in enumerate(names):
            for plane in vars(alloc.layers[name]).values():
                if isinstance(plane, torch.Tensor):
                    tags = (torch.arange(config.num_blocks) * 7 + i * 3 + 1) % 113
                    plane.copy_(tags.view(-1, 1, 1, 1).to(plane.dtype).expand_as(plane))
        for i, name in enumerate(names):
            for plane in vars(alloc.layers[name]).values():
                if isinstance(plane, torch.Tensor):
                    want = ((torch.arange(config.num_blocks) * 7 + i * 3 + 1) % 113).to(plane.dtype)
                    assert torch.equal(plane.amax(dim=(1, 2, 3)), want) and torch.equal(plane.amin(dim=(1, 2, 3)),
                                                                                         want), name


@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC"])
def test_block_major_layouts_cannot_hold_planes(plan, kv_cases, layout):
    specs, memory, _ = kv_cases["dense_gqa"]()
    config = plan(specs, memory, layout)
    with pytest.raises(KVLayoutError, match="dense planes"):
        allocate_kv_caches(config, device="cpu", planes=_declared(specs))


def test_a_planar_layer_overlaid_by_another_geometry_is_refused(plan, kv_cases):
    specs, memory, _ = kv_cases["sliding_window_hybrid"]()
    config = plan(specs, memory, "LBNHC")
    declared = _declared(specs)
    first_full = next(n for g in config.kv_cache_groups for n in g.layer_names if "FullAttention" in
                      type(g.kv_cache_spec).__name__)
    declared.pop(first_full)  # one layer packed, overlaid with a planar one of the other group
    with pytest.raises(KVLayoutError, match=r"share KV memory.*dense planes"):
        allocate_kv_caches(config, device="cpu", planes=declared)


def test_planes_of_refuses_a_tensor_the_allocator_did_not_publish(plan, kv_cases):
    specs, memory, _ = kv_cases["dense_gqa"]()
    config = plan(specs, memory, "LBNHC")
    alloc = allocate_kv_caches(config, device="cpu", planes=_declared(specs))
    name = next(iter(alloc.planar))
    assert kv_planes.planes_of("not.a.layer", torch.zeros(4)) is None
    with pytest.raises(KVLayoutError, match="not the planar region"):
        kv_planes.planes_of(name, alloc.as_vllm_kv_caches()[name].clone())


def test_mla_kv_of_refuses_a_strided_tensor():
    cells = torch.zeros(3, 16, 600)[..., :576]
    with pytest.raises(KVLayoutError, match="not the dense planar region"):
        mla_kv_of(cells, 512)


def test_plane_names_come_from_the_kernel_backends_declared_layout(kv_cases, monkeypatch):
    from ascend_kernels import op_registry

    specs, _, _ = kv_cases["dense_gqa"]()
    spec = next(iter(specs.values()))
    for backend in ("reference", "npu"):  # both declared; the npu declaration is read without torch_npu
        declared = op_registry.kv_layout(backend).planes("attention")
        assert kv_planes.attention_planes(spec, backend).names == tuple(declared) == ("key", "value")
    renamed = op_registry.KvLayout(attention=(("k", ("num_blocks", "block_size", "num_kv_heads", "head_size")),
                                              ("v", ("num_blocks", "block_size", "num_kv_heads", "head_size_v"))),
                                   mla=op_registry.kv_layout("npu").mla, contiguous=True)
    monkeypatch.setitem(op_registry.KV_LAYOUTS, "npu", renamed)
    assert kv_planes.attention_planes(spec, "npu").names == ("k", "v")
    head_major = op_registry.KvLayout(attention=(("key", ("num_blocks", "num_kv_heads", "block_size", "head_size")),
                                                 ("value", ("num_blocks", "num_kv_heads", "block_size", "head_size"))),
                                      mla=renamed.mla, contiguous=True)
    monkeypatch.setitem(op_registry.KV_LAYOUTS, "npu", head_major)
    with pytest.raises(KVLayoutError, match="kernel backend 'npu' declares attention planes"):
        kv_planes.attention_planes(spec, "npu")


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
def test_attention_planes_beside_mamba_states_are_paged_and_stay_inside_their_pages(plan, kv_cases, layout):
    specs, memory, _ = kv_cases["mamba_hybrid"]()
    config = plan(specs, memory, layout)
    attention = {n: s for n, s in specs.items() if n.endswith(".attn")}
    alloc = allocate_kv_caches(config, device="cpu", planes=_declared(attention))
    packed = allocate_kv_caches(config, device="cpu")
    assert alloc.nbytes == packed.nbytes
    for name in attention:
        geometry = alloc.planar[name]
        assert geometry.block_stride is not None, name
        kv = alloc.layers[name]
        assert isinstance(kv, AttentionKV)
        # Block b's K and V lie inside the bytes the packed cells of block b take (the page vLLM planned).
        cells = packed.vllm_views[name]
        page = cells.stride(0) * cells.element_size()
        for b in (0, 1, alloc.num_blocks - 1):
            for part in (kv.key, kv.value):
                start = part[b].data_ptr() - alloc.vllm_views[name].data_ptr()
                end = start + part[b].numel() * part.element_size()
                assert b * page <= start and end <= b * page + page, (name, b, start, end, page)
        bound = attention_kv_of(alloc.vllm_views[name], attention[name].head_size)
        assert bound.key.data_ptr() == kv.key.data_ptr() and bound.value.data_ptr() == kv.value.data_ptr()
    # Zeroing a block of the attention layers leaves the Mamba states of every other block as they were.
    state_layers = [n for n in specs if n.endswith(".mixer")]
    for name in list(attention) + state_layers:
        for part in (alloc.layers[name].tensors if name in state_layers else (alloc.layers[name].key,
                                                                              alloc.layers[name].value)):
            part.fill_(1)
    assert alloc.zero_blocks([2], list(attention)) == 2 * len(attention)
    for name in attention:
        assert not alloc.layers[name].key[2].any() and alloc.layers[name].key[[1, 3]].all()
    for name in state_layers:
        assert all(t[[1, 3]].all() for t in alloc.layers[name].tensors)
