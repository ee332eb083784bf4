"""Data parallelism with expert parallelism across two hosts through `ascend-vllm serve`, with vLLM's own multi-node
DP launch: node 0 (`--data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address <node0's address>
--data-parallel-rpc-port P --enable-expert-parallel`) serves the API and runs DP rank 0, node 1 (the same with
`--data-parallel-start-rank 1 --headless`) runs DP rank 1; the tiny Qwen3-MoE's 8 experts are split 4/4 over the two
EP ranks. Each node is a network namespace (`ascend_testkit.hosts.Topology`), both in the simulated-NPU lane.

The MoE layers' all2all is vLLM's allgather-reducescatter over the EP group (gloo across the link): every rank
gathers every rank's tokens, runs its own experts, and the outputs are summed back. vLLM's CPU communicator has no
uneven all-gather / reduce-scatter; the simulated lane's communicator supplies them
(`ascend_platform.simulated.communicator`).

Answers equal the single engine's (the same model in the same lane, one rank, all experts): the same greedy tokens,
logprobs within float rounding; both DP engines served requests; the MoE traffic crossed the link.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length
from ascend_testkit.servers import ServerProcess, inside

pytestmark = [pytest.mark.engine]

API_PORT = 8300
RPC_PORT = 13345
MAX_TOKENS = 8
LENGTHS = [5, 40, 61, 9]
PROMPTS = [prompt_of_length(n, offset=500 + n) for n in LENGTHS]
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1,
          "extra_body": {"ignore_eos": True, "return_token_ids": True}}
ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=16, seed=0)
# Each expert's output is summed across the EP ranks, and the DP ranks batch the requests differently from the
# single engine: float32 rounding apart (seen: up to 3.3e-05).
LOGPROB_TOL = 5e-4


@dataclass
class DpAcrossHosts:
    topo: object
    node0: ServerProcess  # API server, DP rank 0
    node1: ServerProcess  # headless, DP rank 1
    single: list  # the single engine's greedy outputs for PROMPTS
    hidden_size: int
    num_layers: int

    def client(self):
        return self.node0.openai_client(120.0)


@pytest.fixture(scope="module")
def dp_hosts(tmp_path_factory, cache_root, node_topo, lane_outputs):
    from ascend_testkit.host_servers import node_cpus, start_dp_node_on, two_nodes
    from ascend_testkit.models.moe import TinyMoeSpec, cached_tiny_qwen3_moe
    from ascend_testkit.servers import tiny_serve_args

    spec = TinyMoeSpec()
    model = cached_tiny_qwen3_moe(spec, cache_root / "models")
    logs = tmp_path_factory.mktemp("multihost-dp")
    cpus = node_cpus()
    node = dict(master=node_topo["node0"], rpc_port=RPC_PORT, data_parallel_size=2, log_dir=logs,
                args=[*tiny_serve_args(max_model_len=ENGINE["max_model_len"]), "--enable-expert-parallel"],
                env_extra={"VLLM_SERVER_DEV_MODE": "1"})

    def start(rank: int) -> ServerProcess:
        return start_dp_node_on(node_topo[f"node{rank}"], f"node{rank}", model, API_PORT, peer=f"node{1 - rank}",
                                start_rank=rank, cpu=cpus[rank], **node)

    # node 0 is healthy only once node 1's engine registered with it
    with two_nodes(start, lambda: lane_outputs(model, ENGINE, PROMPTS, MAX_TOKENS)) as (node0, node1, outputs):
        print(f"DP=2 across hosts healthy after {node0.ready_after_s:.0f} s")
        yield DpAcrossHosts(node_topo, node0, node1, outputs, spec.hidden_size, spec.num_layers)


@pytest.fixture
def dp(dp_hosts):
    """The servers, with this test's thread on node0's host (the client's place)."""
    with inside(dp_hosts.topo["node0"]):
        yield dp_hosts


def _finished_per_engine(server: ServerProcess) -> dict[str, float]:
    """Requests each DP engine finished (vLLM's per-engine counter on the API server)."""
    out: dict[str, float] = {}
    for line in server.get("/metrics", timeout=30)[1].decode().splitlines():
        if line.startswith("vllm:request_success_total{"):
            engine = re.search(r'engine="(\d+)"', line).group(1)
            out[engine] = out.get(engine, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_completions_across_hosts_equal_a_single_engines_on_both_dp_ranks(dp):
    before = _finished_per_engine(dp.node0)
    answers: dict[int, object] = {}

    def ask(i: int) -> None:
        with inside(dp.topo["node0"]):
            answers[i] = dp.client().completions.create(model="tiny", prompt=PROMPTS[i], **GREEDY).choices[0]

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(answers) == list(range(len(PROMPTS))), "a request did not finish"
    for i, single in enumerate(dp.single):
        ours = answers[i]
        assert ours.token_ids == single["token_ids"], LENGTHS[i]
        assert len(ours.token_ids) == MAX_TOKENS
        worst = max(abs(ours_lp - step[str(token)]) for ours_lp, step, token in zip(
            ours.logprobs.token_logprobs, single["logprobs"], single["token_ids"], strict=True))
        print(f"{LENGTHS[i]}-token prompt: greedy tokens equal, largest logprob difference {worst:.2e}")
        assert worst < LOGPROB_TOL, (LENGTHS[i], worst)
    after = _finished_per_engine(dp.node0)
    served = {engine: after[engine] - before.get(engine, 0.0) for engine in after}
    print(f"requests per DP engine: {served}")
    assert sum(served.values()) == len(PROMPTS)
    assert served.get("1", 0) > 0 and served.get("0", 0) > 0, served


def test_the_moe_all2all_crosses_the_link(dp):
    for server in (dp.node0, dp.node1):
        log = server.log_path.read_text(errors="replace")
        assert "Using allgather_reducescatter all2all manager" in log, server.name
        assert "Local/global number of experts: 4/8" in log, server.name
    # One prefill of n tokens on one DP rank: every MoE layer sums the experts' outputs of all n tokens across the two
    # ranks (the reduce-scatter), which puts at least n hidden states (float32) per layer on the wire each way.
    n = 200
    node0, node1 = dp.topo["node0"], dp.topo["node1"]
    sent0, sent1 = node0.bytes_sent("node1"), node1.bytes_sent("node0")
    out = dp.client().completions.create(model="tiny", prompt=prompt_of_length(n, offset=4000), max_tokens=1,
                                         temperature=0)
    assert out.usage.prompt_tokens == n
    crossed = node0.bytes_sent("node1") - sent0, node1.bytes_sent("node0") - sent1
    payload = dp.num_layers * n * dp.hidden_size * 4
    print(f"a {n}-token prefill sent node0->node1 {crossed[0]} B, node1->node0 {crossed[1]} B (MoE combine payload "
          f"{payload} B)")
    assert min(crossed) >= payload, crossed


def test_both_nodes_run_the_ascend_platform(dp):
    # vLLM's collective_rpc asks every DP engine but answers with the first one's: DP rank 0 (node 0).
    (rank0,) = dp.node0.collective_rpc("ascend_usage")
    assert rank0["facts"]["runner_class"].startswith("ascend_platform.worker.")
    assert rank0["facts"]["moe.layer_class"].startswith("AscendRoutedExperts")
    assert rank0["counts"]["moe.expert_map"] > 0 and rank0["counts"]["kernels.fused_moe"] > 0
    # Node 1's DP rank: a live worker of node 1's headless server, in node 1's namespace, EP rank 1, whose platform is
    # ours: our platform's attention selector (`AscendPlatformBase.get_attn_backend_cls`) registers the ASCEND backend
    # names, and vLLM logs that from inside the worker. (Its environment and command line are not readable from /proc:
    # vLLM retitles the process, overwriting them.)
    log = dp.node1.log_path.read_text(errors="replace")
    assert "data parallel engine(s) in headless mode" in log
    pids = {int(p) for p in re.findall(r"\(Worker_DP1_EP1 pid=(\d+)\)", log)}
    assert len(pids) == 1, pids
    (pid,) = pids
    assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink(f"/proc/{dp.topo['node1'].pid}/ns/net")
    assert re.search(rf"\(Worker_DP1_EP1 pid={pid}\).*Registered new attention backend: ASCEND -> ascend_platform", log)
    assert re.search(r"EP Rank 1/2\].*Local/global number of experts: 4/8", log)
