"""KV capacity and allocation cost of ascend_core.kv against vLLM's own planner and allocator (same run, same config).

For model-shaped spec mixes, vLLM's `get_kv_cache_configs` plans a budget; we report per case the planner's block
count, the blocks our views can address (shared and private mode), the bytes we allocate over the budget, and our
shared allocation time over vLLM's `allocate_kv_cache` on the same config. Shared and private allocations are made
with a KV transfer configured (2 MiB bases: the worst case for bytes); private mode is planned through
`scale_budget_for_private`. Prints one JSON object (last stdout line).

Then the same in real engines: `engine_capacity_ratio` = the KV blocks a simulated-lane engine (our platform,
allocator and backend) reports over the blocks plain vLLM CPU reports, same tiny model and VLLM_CPU_KVCACHE_SPACE,
same run (each engine in its own host, `ascend_testkit.engine`).

Run: uv run --no-sync python benchmarks/kv_capacity.py [--budget-mib 1024] [--reps 7] [--no-engines]
Goals: shared capacity_ratio == 1.0 everywhere; bytes_ratio <= 1 + 2 MiB / budget; private bytes_ratio
<= 1.0; alloc_time_ratio <= 1.1; engine_capacity_ratio == 1.0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

import torch

MiB = 1 << 20


def log(msg: str, *args) -> None:
    print(msg % args if args else msg, file=sys.stderr, flush=True)


def build_vllm_config():
    """A real VllmConfig around a config.json only: what the planner reads (no weights, no engine)."""
    from transformers import LlamaConfig
    from vllm.config import CacheConfig, ModelConfig, VllmConfig

    model_dir = tempfile.mkdtemp(prefix="kv-capacity-")
    LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                intermediate_size=128, max_position_embeddings=4096).save_pretrained(model_dir)
    model_config = ModelConfig(model=model_dir, max_model_len=1024, skip_tokenizer_init=True, dtype="bfloat16")
    return VllmConfig(model_config=model_config, cache_config=CacheConfig(block_size=32))


def cases():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    from ascend_core.kv.specs import AscendMLAAttentionSpec, AscendSparseIndexerSpec

    def attn(i):
        return f"model.layers.{i}.self_attn.attn"

    bf16 = torch.bfloat16
    dense = {attn(i): FullAttentionSpec(block_size=32, num_kv_heads=8, head_size=128, dtype=bf16) for i in range(32)}
    swa = {attn(i): (SlidingWindowSpec(block_size=32, num_kv_heads=8, head_size=64, dtype=bf16, sliding_window=128)
                     if i % 2 else FullAttentionSpec(block_size=32, num_kv_heads=8, head_size=64, dtype=bf16))
           for i in range(24)}
    mla1 = {attn(i): AscendMLAAttentionSpec.create(block_size=64, num_kv_heads=1, head_size=576, dtype=bf16,
                                                   rope_head_dim=64) for i in range(61)}
    mla4 = {}
    for i in range(30):
        mla4[attn(i)] = AscendMLAAttentionSpec.create(ratio=4, block_size=128, num_kv_heads=1, head_size=576,
                                                      dtype=torch.int8, rope_head_dim=64, scale_dim=4,
                                                      scale_dtype=torch.float32, sparse_c8=True)
        mla4[f"model.layers.{i}.self_attn.indexer.k_cache"] = AscendSparseIndexerSpec.create(
            ratio=4, block_size=128, num_kv_heads=1, head_size=128, dtype=bf16, scale_dim=1,
            scale_dtype=torch.float32)
    mamba = {}
    for i in range(48):
        if i % 4 == 3:
            mamba[attn(i)] = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=128, dtype=bf16)
        else:
            mamba[f"model.layers.{i}.linear_attn"] = MambaSpec(block_size=1024, shapes=((3, 2048), (8, 64, 64)),
                                                               dtypes=(bf16, torch.float32))
    eagle = dict(swa)
    eagle[attn(24)] = FullAttentionSpec(block_size=32, num_kv_heads=8, head_size=64, dtype=bf16)
    return {"dense_gqa": (dense, "LBHNC"), "sliding_window_hybrid": (swa, "LBHNC"), "mla_ratio1": (mla1, "LBHNC"),
            "mla_ratio4": (mla4, "BLHNC"), "mamba_hybrid": (mamba, "LBHNC"), "eagle_draft": (eagle, "LBHNC")}


def plan(vllm_config, specs, layout, memory):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    vllm_config.cache_config.kv_cache_layout = layout
    config = get_kv_cache_configs(vllm_config, [dict(specs)], [memory])[0]
    config.kv_cache_layout = layout
    return config


def usable_blocks(alloc) -> int:
    """Blocks every layer's views can address, each view checked to lie inside its storage."""
    bounds = [(s.data_ptr, s.data_ptr + s.nbytes) for s in alloc.storages]
    usable = None
    for name, view in alloc.as_vllm_kv_caches().items():
        first = view.data_ptr()
        last = first + sum((n - 1) * st for n, st in zip(view.shape, view.stride(), strict=True)) * view.element_size()
        if not any(lo <= first and last < hi for lo, hi in bounds):
            raise AssertionError(f"layer {name}: view outside every storage")
        usable = view.shape[0] if usable is None else min(usable, view.shape[0])
    return usable or 0


def timed(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
        del result
    return best


def run_case(vllm_config, name, specs, layout, budget, reps):
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    from ascend_core.kv.allocator import allocate_kv_caches, scale_budget_for_private

    config = plan(vllm_config, specs, layout, budget)
    shared = allocate_kv_caches(config, device="cpu", kv_transfer=True)
    shared_usable = usable_blocks(shared)
    shared_bytes = shared.nbytes
    del shared
    private_config = plan(vllm_config, specs, layout, scale_budget_for_private(config, budget, kv_transfer=True))
    private = allocate_kv_caches(private_config, device="cpu", mode="private", kv_transfer=True)
    private_usable, private_bytes = usable_blocks(private), private.nbytes
    del private
    # Without a transfer engine, private buffers need no 2 MiB bases: what the planner then grants.
    plain_blocks = plan(vllm_config, specs, layout, scale_budget_for_private(config, budget)).num_blocks

    vllm_layout = KVCacheLayout[layout]
    vllm_s, ours_s = [], []
    for _ in range(reps):  # interleaved so machine noise hits both alike
        vllm_s.append(timed(lambda: allocate_kv_cache(config, torch.device("cpu"), vllm_layout), 1))
        ours_s.append(timed(lambda: allocate_kv_caches(config, device="cpu", layout=layout), 1))
    vllm_t, ours_t = min(vllm_s), min(ours_s)
    result = {
        "planner_blocks": config.num_blocks,
        "groups": len(config.kv_cache_groups),
        "layers": len(specs),
        "layout": layout,
        "budget_bytes": budget,
        "bytes_ratio_limit": 1 + 2 * MiB / budget,
        "shared": {"usable_blocks": shared_usable, "capacity_ratio": shared_usable / config.num_blocks,
                   "bytes_ratio": shared_bytes / budget},
        "private": {"usable_blocks": private_usable, "capacity_ratio": private_usable / config.num_blocks,
                    "bytes_ratio": private_bytes / budget, "planned_blocks_no_transfer": plain_blocks,
                    "capacity_ratio_no_transfer": plain_blocks / config.num_blocks},
        "alloc_s": {"ascend": ours_t, "vllm": vllm_t},
        "alloc_time_ratio": ours_t / vllm_t,
    }
    log("%s: %s", name, json.dumps(result))
    return result


def engine_blocks(kv_space_gib: int) -> dict[str, int]:
    """KV blocks the engine's scheduler got, for plain vLLM CPU and for our simulated lane, same model and space."""
    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    model = cached_tiny_llama()
    engine = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, block_size=32, seed=0)
    blocks = {}
    with tempfile.TemporaryDirectory(prefix="kv-capacity-engines-") as tmp:
        hosts = {lane: EngineHost(f"capacity-{lane}", lane=lane, log_dir=tmp,
                                  env={"VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib)}) for lane in ("cpu", "simulated")}
        try:
            for host in hosts.values():
                host.start(model, wait=False, **engine)
            for lane, host in hosts.items():
                host.started()
                blocks[lane] = host.total_blocks()
                log("%s engine: %d KV blocks", lane, blocks[lane])
        finally:
            for host in hosts.values():
                host.close()
    return blocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--kv-space-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE of the engine pair")
    parser.add_argument("--no-engines", action="store_true", help="skip the engine pair (engine ratio null)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    vllm_config = build_vllm_config()
    from ascend_core.kv.specs import register_ascend_kv_specs

    register_ascend_kv_specs()
    budget = args.budget_mib * MiB
    results = {name: run_case(vllm_config, name, specs, layout, budget, args.reps)
               for name, (specs, layout) in cases().items()}
    total_ours = sum(r["alloc_s"]["ascend"] for r in results.values())
    total_vllm = sum(r["alloc_s"]["vllm"] for r in results.values())
    out = {
        "cases": results,
        "min_capacity_ratio": min(r["shared"]["capacity_ratio"] for r in results.values()),
        "max_bytes_ratio": max(max(r["shared"]["bytes_ratio"], r["private"]["bytes_ratio"]) for r in results.values()),
        "alloc_time_ratio": total_ours / total_vllm,
        "max_private_bytes_ratio": max(r["private"]["bytes_ratio"] for r in results.values()),
        "max_case_alloc_time_ratio": max(r["alloc_time_ratio"] for r in results.values()),
        "budget_bytes": budget,
        "bytes_ratio_limit": 1 + 2 * MiB / budget,
    }
    if not args.no_engines:
        blocks = engine_blocks(args.kv_space_gib)
        out["engine_capacity_ratio"] = blocks["simulated"] / blocks["cpu"]
        out["engine_blocks"] = blocks
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
