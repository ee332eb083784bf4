"""The runners' KV hook on real vLLM parts: planner config, `Attention` layers, our allocator and kernels.

The MRV2 runner's `_ascend_init_kv_cache` (what the `mrv2.init_kv_cache` patch swaps in) lets vLLM bind our
allocator's tensors to its layers; the attention impl reads the `kv_cache` vLLM hands it at each call and holds no
KV memory of its own. The V1 path shares `kv_binding` and runs end to end in tests/platform.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    cache = os.environ.get("ASCEND_VLLM_CACHE")
    return cached_tiny_llama(cache_dir=f"{cache}/models" if cache else tmp_path_factory.mktemp("models"))


@pytest.fixture(params=["LBNHC", "LBHNC"])
def vllm_config(request, tiny_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    saved = dict(os.environ)
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=str(tiny_model), dtype="float32", max_model_len=256, max_num_seqs=4, block_size=32,
                     enforce_eager=True, kv_cache_memory_bytes=1 << 22).create_engine_config()
    cfg.cache_config.kv_cache_layout = request.param  # each layout the backend declares
    yield cfg
    os.environ.clear()
    os.environ.update(saved)


def _layers_and_config(cfg):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    from ascend_platform.attention.backend import AscendAttentionBackend
    from ascend_platform.attention.selector import register_backend_names

    register_backend_names()  # the platform does this when vLLM asks it for a backend
    names = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
    with set_current_vllm_config(cfg):
        layers = {n: Attention(2, 32, 32**-0.5, num_kv_heads=2, prefix=n, attn_backend=AscendAttentionBackend)
                  for n in names}
    spec = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
    kv_config = get_kv_cache_config_from_groups(cfg, [KVCacheGroupSpec(names, spec)], 64 * spec.page_size_bytes * 2)
    return layers, kv_config


def _bind(cfg):
    from ascend_platform.worker.model_runner_v2 import AscendRunnerV2Mixin

    layers, kv_config = _layers_and_config(cfg)
    forward_context = cfg.compilation_config.static_forward_context
    runner = AscendRunnerV2Mixin()
    caches = runner._ascend_init_kv_cache(forward_context, kv_config, torch.device("cpu"), [32, 32], cfg)
    return runner, layers, kv_config, caches


def _write(layer, key, value, slots):
    """One cache write the way vLLM's attention layer makes it: the impl gets the layer's bound `kv_cache`."""
    layer.impl.do_kv_cache_update(layer, key, value, layer.kv_cache, slots)


def test_layers_are_bound_to_our_allocator_and_the_impl_writes_there(vllm_config):
    from ascend_core.kv.views import AttentionKV, attention_kv_of
    from ascend_platform import usage

    runner, layers, kv_config, caches = _bind(vllm_config)
    assert set(caches) == set(layers) and usage.snapshot()["facts"]["allocator"].startswith("ascend_core.kv")
    assert usage.snapshot()["facts"]["attention.ascend.bound_layers"] == 2
    ours = {s.tensor.untyped_storage().data_ptr() for s in runner.ascend_kv.storages}
    first, second = layers.values()
    assert first.kv_cache is caches[first.layer_name] and first.kv_cache.untyped_storage().data_ptr() in ours
    assert not any(isinstance(v, AttentionKV | torch.Tensor) for v in vars(first.impl).values())  # no 2nd binding
    kv = attention_kv_of(first.kv_cache, 32)
    typed = runner.ascend_kv.layers[first.layer_name]  # the allocator's own typed views: the same bytes
    for mine, its in ((kv.key, typed.key), (kv.value, typed.value)):
        assert (mine.data_ptr(), mine.shape, mine.stride()) == (its.data_ptr(), its.shape, its.stride())
    assert kv.key.shape == (kv_config.num_blocks, 32, 2, 32)

    # A cache write through the impl lands in the bytes vLLM's view of the layer covers, and only there.
    key = torch.randn(3, 2, 32)
    _write(first, key, -key, torch.tensor([0, 33, 65]))
    assert torch.equal(kv.key[1, 1], key[1]) and torch.equal(kv.value[2, 1], -key[2])
    assert first.kv_cache.abs().sum() > 0 and second.kv_cache.abs().sum() == 0


def test_the_layer_tensor_is_what_the_backend_declares(vllm_config):
    """vLLM plans the pages in a layout the backend supports; the backend's kernels take K and V as dense planes of
    the layer's planned region (torch_npu's paged caches), and that is the tensor vLLM binds."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from ascend_platform.attention.backend import AscendAttentionBackend as Backend

    layouts = Backend.supported_kv_cache_layouts()
    assert layouts == (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)
    runner, layers, kv_config, _ = _bind(vllm_config)
    for index, layer in enumerate(layers.values()):
        kv_cache = layer.kv_cache
        assert kv_cache.shape == Backend.get_kv_cache_shape(kv_config.num_blocks, 32, 2, 32)
        assert kv_cache.is_contiguous() and kv_cache.shape[0] == 2  # K plane, then V plane
        # the planes fill exactly the region vLLM's descriptor planned for the layer
        (tensor,) = kv_config.kv_cache_tensors  # the current lane: one descriptor for the two layers
        base = runner.ascend_kv.storages[0].data_ptr
        assert kv_cache.data_ptr() - base == tensor.offset + index * tensor.layer_stride
        assert kv_cache.numel() * kv_cache.element_size() == kv_config.num_blocks * tensor.block_stride
    assert Backend.get_kv_cache_stride_order() == KVCacheLayout.LBNHC.layer_view_order
    assert Backend.get_kv_cache_stride_order(include_num_layers_dimension=True) == KVCacheLayout.LBNHC.stride_order


def test_release_and_reallocation_rebind_the_impl_to_the_new_memory(vllm_config):
    from ascend_core.kv.views import attention_kv_of
    from ascend_platform.worker import kv_binding

    runner, layers, kv_config, _ = _bind(vllm_config)
    first = next(iter(layers.values()))
    forward_context = vllm_config.compilation_config.static_forward_context
    kv_binding.detach_layer_kv(forward_context)
    runner.ascend_kv = None
    assert all(layer.kv_cache.numel() == 0 for layer in layers.values())
    with pytest.raises(RuntimeError, match="was handed no KV cache"):
        _write(first, torch.randn(1, 2, 32), torch.randn(1, 2, 32), torch.tensor([0]))

    runner._ascend_init_kv_cache(forward_context, kv_config, torch.device("cpu"), [32, 32], vllm_config)
    assert first.kv_cache.numel() > 0
    key = torch.randn(1, 2, 32)
    _write(first, key, key, torch.tensor([40]))
    assert torch.equal(attention_kv_of(first.kv_cache, 32).key[1, 8], key[0])  # the write went to the new tensor
    assert runner.ascend_kv.layers[first.layer_name].key[1, 8].equal(key[0])  # ... which the new allocation owns


def test_a_layer_bound_to_foreign_memory_is_refused(vllm_config):
    from ascend_platform.worker import kv_binding

    runner, layers, _, _ = _bind(vllm_config)
    first = next(iter(layers.values()))
    first.kv_cache = first.kv_cache.clone()  # vLLM's own allocation, say: not the Ascend allocator's memory
    with pytest.raises(RuntimeError, match=first.layer_name):
        kv_binding.count_ascend_layers_on(runner.ascend_kv, vllm_config.compilation_config.static_forward_context)


def test_kernel_block_split_is_refused(vllm_config):
    from ascend_platform.worker.model_runner_v2 import AscendRunnerV2Mixin

    _, kv_config = _layers_and_config(vllm_config)
    with pytest.raises(ValueError, match="kernel block size 16 for block size 32"):
        AscendRunnerV2Mixin()._ascend_init_kv_cache(
            vllm_config.compilation_config.static_forward_context, kv_config, torch.device("cpu"), [16], vllm_config)


@pytest.mark.parametrize(("model_type", "modules"), [("longcat_flash", 2), ("llama", 1)])
def test_attention_modules_per_layer(model_type, modules):
    from ascend_platform.worker.kv_binding import attention_modules_per_layer

    assert attention_modules_per_layer(SimpleNamespace(hf_config=SimpleNamespace(model_type=model_type))) == modules
