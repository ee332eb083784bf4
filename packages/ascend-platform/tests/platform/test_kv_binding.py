"""The MRV2 runner's KV hook on real vLLM parts: planner config, `Attention` layers, our allocator and kernels.

The runner's `_ascend_init_kv_cache` (what the `mrv2.init_kv_cache` patch swaps in) must bind each layer's vLLM
view and hand our impl key/value views of the same bytes; the V1 path shares `kv_binding` and runs end to end in
tests/platform.
"""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    cache = os.environ.get("ASCEND_VLLM_CACHE")
    return cached_tiny_llama(cache_dir=f"{cache}/models" if cache else tmp_path_factory.mktemp("models"))


@pytest.fixture
def vllm_config(tiny_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    saved = dict(os.environ)
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=str(tiny_model), dtype="float32", max_model_len=256, max_num_seqs=4, block_size=32,
                     enforce_eager=True, kv_cache_memory_bytes=1 << 22).create_engine_config()
    cfg.cache_config.kv_cache_layout = "LBHNC"
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


def test_mrv2_hook_binds_vllm_views_and_our_views_of_the_same_bytes(vllm_config):
    from ascend_platform import usage
    from ascend_platform.facade import kernel_ops
    from ascend_platform.worker.model_runner_v2 import AscendRunnerV2Mixin

    layers, kv_config = _layers_and_config(vllm_config)
    forward_context = vllm_config.compilation_config.static_forward_context
    runner = AscendRunnerV2Mixin()
    caches = runner._ascend_init_kv_cache(forward_context, kv_config, torch.device("cpu"), [32, 32], vllm_config)

    assert set(caches) == set(layers) and usage.snapshot()["facts"]["allocator"].startswith("ascend_core.kv")
    first, second = layers.values()
    assert first.kv_cache is caches[first.layer_name] and first.impl.kv is not None
    key_cache = first.impl.kv.key
    assert key_cache.shape == (kv_config.num_blocks, 32, 2, 32)

    # A cache write through the kernel facade lands in the bytes vLLM's view of the layer covers, and only there.
    key = torch.randn(3, 2, 32)
    kernel_ops().reshape_and_cache(key, key.clone(), key_cache, first.impl.kv.value, torch.tensor([0, 33, 65]))
    assert torch.equal(key_cache[1, 1], key[1]) and torch.equal(key_cache[2, 1], key[2])
    assert first.kv_cache.abs().sum() > 0 and second.kv_cache.abs().sum() == 0
    assert second.impl.kv.key.abs().sum() == 0


def test_release_unbinds_every_layer(vllm_config):
    from ascend_platform.worker.kv_binding import unbind_ascend_impls
    from ascend_platform.worker.model_runner_v2 import AscendRunnerV2Mixin

    layers, kv_config = _layers_and_config(vllm_config)
    forward_context = vllm_config.compilation_config.static_forward_context
    AscendRunnerV2Mixin()._ascend_init_kv_cache(forward_context, kv_config, torch.device("cpu"), [32, 32],
                                               vllm_config)
    unbind_ascend_impls(forward_context)
    assert all(layer.impl.kv is None and layer.kv_cache.numel() == 0 for layer in layers.values())


def test_kernel_block_split_is_refused(vllm_config):
    from ascend_platform.worker.model_runner_v2 import AscendRunnerV2Mixin

    _, kv_config = _layers_and_config(vllm_config)
    with pytest.raises(ValueError, match="kernel block size 16 for block size 32"):
        AscendRunnerV2Mixin()._ascend_init_kv_cache(
            vllm_config.compilation_config.static_forward_context, kv_config, torch.device("cpu"), [16], vllm_config)
