"""The speculator's data-parallel argument through a real two-process DP group (gloo on 127.0.0.1).

vLLM 0.32 cannot run `data_parallel_size=2` for these targets on this machine: offline `LLM(data_parallel_size=2)`
is refused ("not supported for single-process usage"), the env-driven offline SPMD mode refuses dense models, and a
served dense model runs its DP ranks as independent DP=1 engines (`EngineCoreProc`), so Model Runner V2 hands the
speculator `dp_sync_state=None` (the MRV2 engine tests assert exactly that count). The runner agrees a DP state
only for MoE targets. So two processes (`dp_argument_driver.py`) join vLLM's own DP group, vLLM's
`dispatch_cg_and_sync_dp` agrees a `DPSyncState` over it, and an Ascend speculator's `propose` must hand that very
object to vLLM's `EagleSpeculator.propose` under the name the installed vLLM takes, whichever lane's name the caller
used, where upstream's reuse of it for the draft batch must agree across both ranks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from ascend_testkit.reach.collect import reach_env

DRIVER = Path(__file__).with_name("dp_argument_driver.py")
TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dp_sync_state_reaches_upstream_propose_on_both_ranks(tmp_path):
    port = _free_port()
    env = {**os.environ, "ASCEND_VLLM_SIMULATE": "1", "TRITON_INTERPRET": "1", "VLLM_CACHE_ROOT": str(tmp_path),
           "GLOO_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1", **reach_env()}
    ranks = [subprocess.Popen([sys.executable, str(DRIVER), str(rank), str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    results = []
    try:
        for proc in ranks:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            assert proc.returncode == 0, f"rank exited {proc.returncode}:\n{err[-3000:]}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    for rank, r in enumerate(results):
        assert r["rank"] == rank and r["dp_group_size"] == 2 and r["torch_backend"] == "gloo", r
        # Rank r scheduled r + 1 tokens: the agreement carries both counts, so the state really crossed processes.
        assert r["agreed_tokens_across_dp"] == [1, 2] and r["agreed_num_reqs"] == 2, r
        for name, call in r["calls"].items():
            assert call["same_object"], f"rank {rank}: propose(... {name}=state) did not forward the state itself"
            assert call["keys"] == ["dp_sync_state"], f"rank {rank}, caller's {name}: upstream got {call['keys']}"
            # Upstream pads the draft batch to the agreed request count on every rank.
            assert call["draft_tokens_across_dp"] == [2, 2] and call["draft_batch_tokens"] == 2, call
        assert r["counts"] == {"propose": 2, "dp:dp_sync_state=DPSyncState": 2}, r["counts"]
