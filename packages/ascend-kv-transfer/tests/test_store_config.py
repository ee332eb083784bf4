"""What the pool reads from vLLM's configs: the groups it can store (others refused by name), the block size, the
namespace both roles derive, and the failure policy it requires."""

from types import SimpleNamespace

import pytest
import torch

from ascend_kv_transfer.pool.config_info import layer_order, namespace, pool_block_tokens
from ascend_kv_transfer.store_connector import _check_failure_policy


def _config(*specs):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    from ascend_core.upstream import make_kv_tensor

    groups = [KVCacheGroupSpec([f"g{i}.l0", f"g{i}.l1"], spec) for i, spec in enumerate(specs)]
    tensors = [make_kv_tensor(1 << 20, [name]) for g in groups for name in g.layer_names]
    return KVCacheConfig(num_blocks=16, kv_cache_tensors=tensors, kv_cache_groups=groups)


def _vllm(dcp=1, model="/m/tiny", tp=None):
    from vllm.config import ParallelConfig  # vLLM's own: it refuses sizes no engine could have (tp % dcp)

    parallel = ParallelConfig(tensor_parallel_size=tp or dcp, decode_context_parallel_size=dcp)
    return SimpleNamespace(parallel_config=parallel,
                           cache_config=SimpleNamespace(block_size=128), model_config=SimpleNamespace(model=model))


def _full(block=128):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=block, num_kv_heads=2, head_size=32, dtype=torch.float32)


def test_full_attention_groups():
    cfg = _config(_full(), _full())
    assert pool_block_tokens(_vllm(), cfg) == 128
    assert pool_block_tokens(_vllm(dcp=2), cfg) == 256  # a block id covers block_size x dcp tokens
    assert layer_order(cfg) == {0: ["g0.l0", "g0.l1"], 1: ["g1.l0", "g1.l1"]}
    ns = namespace(_vllm(), cfg, "", 128)
    assert ns == namespace(_vllm(), _config(_full(), _full()), "", 128)
    assert ns != namespace(_vllm(model="/m/other"), cfg, "", 128)
    assert ns != namespace(_vllm(), cfg, "shared-name", 128)


def test_other_groups_are_refused_by_name():
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    window = SlidingWindowSpec(block_size=128, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=256)
    with pytest.raises(ValueError, match="KV cache group 1 .* is SlidingWindowSpec"):
        pool_block_tokens(_vllm(), _config(_full(), window))
    with pytest.raises(ValueError, match=r"one block size across KV cache groups, got \[64, 128\]"):
        pool_block_tokens(_vllm(), _config(_full(), _full(64)))


def test_recompute_policy_is_required():
    _check_failure_policy(SimpleNamespace(kv_load_failure_policy="recompute"))
    with pytest.raises(ValueError, match="kv_load_failure_policy='recompute', got 'fail'"):
        _check_failure_policy(SimpleNamespace(kv_load_failure_policy="fail"))


def _mla_vllm(tp: int, use_mla: bool = True, dcp: int = 1):
    vllm = _vllm(dcp=dcp, tp=tp)
    vllm.model_config.use_mla = use_mla
    return vllm


def test_tp_replicated_kv_is_one_object_per_block_for_any_tp_size():
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from ascend_kv_transfer.pool.config_info import engine_rank_sizes, tp_replicated

    cfg = _config(MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=576, dtype=torch.float32))
    assert tp_replicated(_mla_vllm(2), cfg) and not tp_replicated(_mla_vllm(2, use_mla=False), cfg)
    assert not tp_replicated(_mla_vllm(2, dcp=2), cfg)  # DCP deals the latent's tokens out over the TP ranks
    # MLA engines of any TP size share one namespace and one rank part per block; others keep theirs
    assert namespace(_mla_vllm(1), cfg, "", 128) == namespace(_mla_vllm(2), cfg, "", 128)
    heads = _config(_full())
    assert namespace(_mla_vllm(1, use_mla=False), heads, "", 128) != namespace(_mla_vllm(2, use_mla=False), heads,
                                                                               "", 128)
    one = engine_rank_sizes(_mla_vllm(4), replicated=True).all_ranks()
    assert [r.tag for r in one] == ["tp0-1.pp0-1.pcp0-1.dcp0-1"]
    assert len(engine_rank_sizes(_mla_vllm(4)).all_ranks()) == 4


def test_refinements_of_full_attention_are_stored_and_compressed_mla_is_refused():
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from ascend_core.kv.specs import AscendMLAAttentionSpec
    from ascend_core.upstream import mla_ratio_kwargs

    latent = dict(block_size=128, num_kv_heads=1, head_size=576, dtype=torch.float32)
    assert pool_block_tokens(_vllm(), _config(AscendMLAAttentionSpec(**latent))) == 128  # the simulated lane's spec
    compressed = MLAAttentionSpec(**latent, **mla_ratio_kwargs(4, MLAAttentionSpec))
    with pytest.raises(ValueError, match="compressed: one state per 4 tokens"):
        pool_block_tokens(_vllm(), _config(compressed))
