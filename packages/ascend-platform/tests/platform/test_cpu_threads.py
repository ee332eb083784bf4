"""OpenMP placement of the simulated lane's workers (vLLM-CPU's policy for an out-of-tree platform)."""

from __future__ import annotations

import pytest

from ascend_platform.worker.cpu_threads import worker_cpus


def test_auto_reserves_a_cpu_per_rank_and_splits_the_rest():
    assert worker_cpus(0, 1, "auto", allowed=[0, 1]) == [0]
    assert worker_cpus(0, 1, "auto", allowed=[0, 1, 2, 3]) == [0, 1, 2]
    assert worker_cpus(1, 2, "auto", allowed=list(range(8))) == [3, 4, 5]
    assert worker_cpus(0, 1, "auto", allowed=[5]) == [5]  # one CPU: share it rather than run nowhere


def test_explicit_lists_and_nobind():
    assert worker_cpus(1, 2, "0-1|2,4-5") == [2, 4, 5]
    assert worker_cpus(0, 1, "nobind") is None
    with pytest.raises(ValueError, match="names 1 CPU lists for 2 local ranks"):
        worker_cpus(0, 2, "0-3")


def test_a_ray_placement_counts_the_ranks_of_this_node():
    from vllm.config import ParallelConfig

    from ascend_platform.worker.cpu_threads import ranks_on_this_node

    # TP=2 with one rank on each of two hosts: vLLM's local_world_size still says 2 (nnodes stays 1 under Ray).
    # Built as "mp" and then switched: ParallelConfig("ray") imports Ray, which this package does not depend on.
    ray = ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="mp")
    ray.distributed_executor_backend = "ray"
    ray.assigned_physical_gpu_ids = [0]
    assert ray.local_world_size == 2 and ranks_on_this_node(ray) == 1
    mp = ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="mp")
    assert ranks_on_this_node(mp) == 2
