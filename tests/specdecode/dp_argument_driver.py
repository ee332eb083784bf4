"""One rank of a real two-process data-parallel group (gloo on 127.0.0.1) driving a speculator's DP argument.

Run as `python dp_argument_driver.py RANK PORT` twice (ranks 0 and 1, same free PORT). The rank joins vLLM's DP
group through vLLM's own `init_distributed_environment` / `initialize_model_parallel` (data_parallel_size=2), has
vLLM's MRV2 `dispatch_cg_and_sync_dp` agree a `DPSyncState` over it (rank r schedules r + 1 decode requests), and
calls `propose` of an Ascend speculator with that state, once under each lane's argument name. The speculator's
upstream parent is vLLM's `EagleSpeculator` with its `propose` wrapped (same signature, `functools.wraps`) so that it
records what arrived and runs upstream's reuse of the state for the draft batch
(`_build_uniform_batch_dp_sync` + `dispatch_cg_and_sync_dp(dp_sync_state=...)`) instead of a draft model. Prints ONE
JSON line with what each call forwarded.

Why not an engine: vLLM 0.32 treats the ranks of a dense model as independent engines (`EngineCoreProc`, DP=1 in the
runner: `dp_sync_state` is always None there, as the engine tests assert), and offline `LLM(data_parallel_size=2)`
is refused; the runner syncs DP only for MoE targets.
"""

from __future__ import annotations

import functools
import json
import sys
from types import SimpleNamespace


def main(rank: int, port: int) -> dict:
    import torch
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import get_dp_group, init_distributed_environment, initialize_model_parallel
    from vllm.v1.worker.gpu.dp_utils import DPSyncState, dispatch_cg_and_sync_dp
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

    from ascend_specdecode.speculators.base import AscendSpeculatorMixin

    parallel = ParallelConfig(data_parallel_size=2, data_parallel_rank=rank, data_parallel_master_ip="127.0.0.1",
                              data_parallel_master_port=port)
    # ParallelConfig picks its own free ports per process; both ranks must meet on `port`.
    parallel._data_parallel_master_port_list = []
    parallel.data_parallel_master_port = port
    with set_current_vllm_config(VllmConfig(parallel_config=parallel)):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
        initialize_model_parallel(1, 1)
        num_reqs = rank + 1
        _, state = dispatch_cg_and_sync_dp(None, num_reqs=num_reqs, num_tokens=num_reqs, uniform_token_count=1,
                                           dp_size=2, dp_rank=rank, need_eager=True)
        assert isinstance(state, DPSyncState), state

        class RecordingEagle(EagleSpeculator):
            @functools.wraps(EagleSpeculator.propose)
            def propose(self, *args, **kwargs):
                got, reqs = kwargs.get("dp_sync_state"), kwargs["input_batch"].num_reqs
                draft_sync, num_tokens = self._build_uniform_batch_dp_sync(got, reqs)
                desc, reused = dispatch_cg_and_sync_dp(None, num_reqs=reqs, num_tokens=num_tokens,
                                                       uniform_token_count=1, dp_size=2, dp_rank=rank,
                                                       need_eager=True, dp_sync_state=draft_sync)
                return {"same_object": got is state, "keys": sorted(k for k in kwargs if k != "input_batch"),
                        "draft_tokens_across_dp": reused.num_tokens_across_dp.tolist(),
                        "draft_batch_tokens": desc.num_tokens}

        speculator = object.__new__(type("Probe", (AscendSpeculatorMixin, RecordingEagle), {}))
        calls = {name: speculator.propose(input_batch=SimpleNamespace(num_reqs=num_reqs),
                                                    **{name: state})
                 for name in ("dp_sync_state", "dp_sync")}
        return {"rank": rank, "dp_group_size": get_dp_group().world_size,
                "agreed_tokens_across_dp": state.num_tokens_across_dp.tolist(), "agreed_num_reqs": state.num_reqs,
                "calls": calls, "counts": dict(speculator.ascend_counts),
                "torch_backend": torch.distributed.get_backend(get_dp_group().cpu_group)}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))), flush=True)
