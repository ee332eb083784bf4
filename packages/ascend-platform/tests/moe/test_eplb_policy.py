"""The EPLB placement and policy on synthetic routing traces: replicas, packing, and the load each rank then takes."""

from __future__ import annotations

import pytest
import torch

from ascend_platform.moe.eplb_policy import rebalance, replica_counts
from ascend_platform.moe.placement import ExpertPlacement, imbalance


def _trace(weights, tokens=512, k=2, seed=0):
    """Logical expert ids `[tokens, k]` drawn without replacement per token with probabilities `weights`."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.tensor(weights, dtype=torch.float64).expand(tokens, -1)
    return torch.multinomial(probs, k, replacement=False, generator=gen)


def _measured(placement: ExpertPlacement, ids: torch.Tensor) -> float:
    """Route the trace through the placement (replica per token) and measure per-rank max/mean."""
    physical = placement.physical_ids(ids)
    load = torch.bincount(physical.reshape(-1), minlength=placement.num_physical)
    return imbalance(placement.rank_load(load))


def test_replicas_go_to_the_heaviest_per_replica_load():
    assert replica_counts([10, 1, 1, 1], 6) == [3, 1, 1, 1]
    assert replica_counts([4, 4, 1, 1], 6) == [2, 2, 1, 1]
    with pytest.raises(ValueError, match="cannot hold"):
        replica_counts([1, 1, 1], 2)


def test_initial_placement_is_vllms_linear_one_with_local_copies():
    p = ExpertPlacement.initial(num_logical=8, num_redundant=2, ep_size=2, ep_rank=1)
    assert p.phys2log == [0, 1, 2, 3, 0, 4, 5, 6, 7, 4]
    assert p.slots_per_rank == 5 and p.local_slice() == [4, 5, 6, 7, 4]
    assert p.replica_count.tolist() == [2, 1, 1, 1, 2, 1, 1, 1]
    with pytest.raises(ValueError, match="divide"):
        ExpertPlacement.initial(num_logical=8, num_redundant=1, ep_size=2, ep_rank=0)


def test_replicas_alternate_by_token_and_other_ranks_pairs_are_minus_one():
    p = ExpertPlacement([0, 1, 2, 0, 3, 1], num_logical=4, ep_size=2, ep_rank=1)
    ids = torch.tensor([[0, 3], [0, 1], [0, 2]])
    physical = p.physical_ids(ids)
    assert physical.tolist() == [[0, 4], [3, 5], [0, 2]]  # expert 0: slots 0, 3, 0 by token; expert 1: 1, 5
    assert p.local_rows(physical).tolist() == [[-1, 1], [0, 2], [-1, -1]]
    load = torch.bincount(physical.reshape(-1), minlength=6)
    assert p.logical_load(load).tolist() == [3, 1, 1, 1]
    assert p.rank_load(load).tolist() == [3, 3]


def test_placement_rejects_a_map_missing_an_expert():
    with pytest.raises(ValueError, match="missing"):
        ExpertPlacement([0, 1, 1, 0], num_logical=3, ep_size=2, ep_rank=0)


@pytest.mark.parametrize("weights", [
    [8, 8, 8, 8, 1, 1, 1, 1],  # one rank's experts take most tokens
    [30, 10, 5, 5, 2, 2, 1, 1],  # one hot expert
    [5, 1, 5, 1, 5, 1, 5, 1],  # interleaved
    [1] * 8,  # already balanced
])
def test_rebalanced_trace_is_within_1_15_on_every_rank(weights):
    ids = _trace(weights)
    before = ExpertPlacement.initial(num_logical=8, num_redundant=2, ep_size=2, ep_rank=0)
    physical = before.physical_ids(ids)
    load = before.logical_load(torch.bincount(physical.reshape(-1), minlength=10))
    new_map = rebalance(load.tolist(), ep_size=2, slots_per_rank=5, previous=before.phys2log)
    after = ExpertPlacement(new_map, num_logical=8, ep_size=2, ep_rank=0)
    assert sorted(set(new_map)) == list(range(8))
    assert _measured(after, ids) <= 1.15, (weights, new_map)
    if _measured(before, ids) > 1.15:
        assert _measured(after, ids) < _measured(before, ids)


def test_four_ranks_and_determinism():
    ids = _trace([20, 15, 10, 8, 6, 4, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1], tokens=1024, seed=3)
    before = ExpertPlacement.initial(num_logical=16, num_redundant=4, ep_size=4, ep_rank=0)
    load = before.logical_load(torch.bincount(before.physical_ids(ids).reshape(-1), minlength=20)).tolist()
    first = rebalance(load, ep_size=4, slots_per_rank=5, previous=before.phys2log)
    assert first == rebalance(load, ep_size=4, slots_per_rank=5, previous=before.phys2log)
    assert _measured(ExpertPlacement(first, num_logical=16, ep_size=4, ep_rank=0), ids) <= 1.15


def test_experts_staying_on_a_rank_keep_their_rows():
    previous = [0, 1, 2, 3, 0, 4, 5, 6, 7, 4]
    new_map = rebalance([1.0] * 8, ep_size=2, slots_per_rank=5, previous=previous)
    for rank in range(2):
        old_rows, new_rows = previous[rank * 5:(rank + 1) * 5], new_map[rank * 5:(rank + 1) * 5]
        for row, expert in enumerate(new_rows):
            if expert in old_rows and old_rows.count(expert) == 1:
                assert old_rows[row] == expert
