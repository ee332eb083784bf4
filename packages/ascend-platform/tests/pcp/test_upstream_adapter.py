"""ascend_core.upstream.pcp hands each lane's PCPManager the keywords it takes (signatures, not versions)."""

from __future__ import annotations

import inspect

from vllm.config import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.pcp_manager import PCPManager

from ascend_core.upstream.pcp import (
    pcp_has_capture_buffers,
    pcp_init_kwargs,
    pcp_partition_arg,
    pcp_partition_kwargs,
    upstream_pcp_manager_cls,
)

CANDIDATES = dict(pcp_world_size=2, pcp_rank=0, device="cpu", shard_decode_requests=False, block_tables=None)


# Signatures shaped like an earlier lane's manager (before vLLM PR 53515), to probe against.
def legacy_init(self, pcp_world_size, pcp_rank, device, shard_decode_requests=False): ...


def legacy_partition(self, input_batch, padded_num_tokens=None): ...


def test_installed_lane():
    assert upstream_pcp_manager_cls() is PCPManager
    assert pcp_init_kwargs(CANDIDATES) == CANDIDATES
    assert "max_num_reqs" in inspect.signature(PCPManager.__init__).parameters
    assert pcp_partition_arg() == "batch_desc"
    assert pcp_has_capture_buffers()


def test_legacy_shapes():
    assert pcp_init_kwargs(CANDIDATES, legacy_init) == {k: CANDIDATES[k] for k in list(CANDIDATES)[:4]}
    assert pcp_partition_arg(legacy_partition) == "padded_num_tokens"
    piecewise = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=64, num_reqs=None)
    eager = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=50, num_reqs=None)
    assert pcp_partition_kwargs(piecewise, legacy_partition) == {"padded_num_tokens": 64}
    assert pcp_partition_kwargs(eager, legacy_partition) == {"padded_num_tokens": None}
    assert pcp_partition_kwargs(piecewise, PCPManager.partition_batch) == {"batch_desc": piecewise}
    assert pcp_partition_kwargs(piecewise, lambda self, input_batch: None) == {}
    assert not pcp_has_capture_buffers(type("Legacy", (), {"partition_batch": legacy_partition}))
