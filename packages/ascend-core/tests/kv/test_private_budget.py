"""Private per-layer buffers (310P runner) planned through `scale_budget_for_private` never exceed the budget the
planner was given, and lose no more capacity than one block's rounding."""

from __future__ import annotations

import pytest

from ascend_core.kv.allocator import (
    KV_TRANSFER_ALIGNMENT,
    allocate_kv_caches,
    private_bytes_per_block,
    private_total_bytes,
    scale_budget_for_private,
    shared_bytes_per_block,
)


@pytest.mark.parametrize("kv_transfer", [False, True])
@pytest.mark.parametrize("case", ["dense_gqa", "sliding_window_hybrid", "mamba_hybrid", "eagle_draft", "mla_ratio4"])
def test_private_total_stays_within_the_budget(plan, kv_cases, case, kv_transfer):
    specs, _, eagle = kv_cases[case]()
    budget = 24 << 20
    layout = "BLHNC" if case == "mla_ratio4" else "LBHNC"
    shared = plan(specs, budget, layout, eagle_layer=eagle)
    scaled = scale_budget_for_private(shared, budget, kv_transfer=kv_transfer)
    config = plan(specs, scaled, layout, eagle_layer=eagle)
    alloc = allocate_kv_caches(config, device="cpu", mode="private", kv_transfer=kv_transfer)
    assert alloc.nbytes <= budget
    assert alloc.nbytes == private_total_bytes(config, config.num_blocks, kv_transfer=kv_transfer)
    # As many blocks as fit: one more would overrun.
    assert private_total_bytes(config, config.num_blocks + 1, kv_transfer=kv_transfer) > budget
    per_block = private_bytes_per_block(config)
    if kv_transfer:  # each buffer's 2 MiB base costs at most its rounding, never a block's worth per buffer more
        assert config.num_blocks >= (budget - KV_TRANSFER_ALIGNMENT * (len(specs) + 1)) // per_block
    if len(shared.kv_cache_groups) == 1 and not kv_transfer:
        assert config.num_blocks == shared.num_blocks  # one group: private costs what shared costs
    if len(shared.kv_cache_groups) > 1:
        assert per_block > shared_bytes_per_block(config)
        assert config.num_blocks < shared.num_blocks


def test_unscaled_private_would_overrun(plan, kv_cases):
    """Why the helper exists: the planner's num_blocks assumes groups overlay."""
    specs, _, _ = kv_cases["sliding_window_hybrid"]()
    budget = 24 << 20
    config = plan(specs, budget, "LBHNC")
    alloc = allocate_kv_caches(config, device="cpu", mode="private")
    assert alloc.nbytes > budget
    assert sum(s.nbytes for s in alloc.storages) == config.num_blocks * private_bytes_per_block(config)
