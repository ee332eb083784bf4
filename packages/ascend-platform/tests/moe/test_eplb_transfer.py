"""Moving expert weights between EP ranks: the plan each rank derives alone, and the move over real gloo ranks."""

from __future__ import annotations

import datetime
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ascend_platform.moe.eplb_transfer import move_expert_weights, plan_moves

OLD = [0, 1, 2, 3, 0, 4, 5, 6, 7, 4]
NEW = [1, 4, 2, 5, 0, 6, 1, 7, 4, 3]  # experts cross ranks both ways, 1 gets a replica on rank 1


def _rows(expert: int, width: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Recognisable weights of `expert`: a w13-like and a w2-like row."""
    return torch.full((2, width), float(expert)), torch.full((width, 3), -float(expert))


def _weights(placement, rank, slots=5):
    experts = placement[rank * slots:(rank + 1) * slots]
    return [torch.stack([_rows(e)[i] for e in experts]) for i in range(2)]


def test_each_rank_plans_copies_receives_and_the_matching_sends():
    plans = [plan_moves(OLD, NEW, ep_rank=r, ep_size=2) for r in range(2)]
    for rank, plan in enumerate(plans):
        rows = sorted([row for row, _ in plan.local_copies] + [row for row, _ in plan.receives])
        assert rows == list(range(5))  # every new row is filled once
        for row, old_row in plan.local_copies:
            assert OLD[rank * 5 + old_row] == NEW[rank * 5 + row]
    sends = sorted((src, dst, dst_row) for src, plan in enumerate(plans) for _, dst, dst_row in plan.sends)
    receives = sorted((src, dst, row) for dst, plan in enumerate(plans) for row, src in plan.receives)
    assert sends == receives and receives  # every receive has exactly one matching send


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        weights = _weights(OLD, rank)
        received = move_expert_weights(weights, plan_moves(OLD, NEW, ep_rank=rank, ep_size=2),
                                       group=dist.group.WORLD, global_ranks=[0, 1])
        results[rank] = (received, [w.clone() for w in weights])
    finally:
        dist.destroy_process_group()


def test_weights_move_over_two_gloo_ranks_in_place():
    results = mp.Manager().dict()
    mp.start_processes(_rank_main, args=(_free_port(), results), nprocs=2, join=True, start_method="fork")
    for rank in range(2):
        received, weights = results[rank]
        expected = _weights(NEW, rank)
        for got, want in zip(weights, expected, strict=True):
            assert torch.equal(got, want), (rank, got[:, 0], want[:, 0])
        assert received == len(plan_moves(OLD, NEW, ep_rank=rank, ep_size=2).receives) > 0


def test_mixed_dtypes_are_refused():
    with pytest.raises(TypeError, match="share a dtype"):
        move_expert_weights([torch.zeros(5, 2), torch.zeros(5, 2, dtype=torch.float16)],
                            plan_moves(OLD, OLD, ep_rank=0, ep_size=2), group=None, global_ranks=[0, 1])
