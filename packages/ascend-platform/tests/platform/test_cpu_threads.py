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
