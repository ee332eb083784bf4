"""Tensor parallelism across two hosts through `ascend-vllm serve`, with vLLM's own mp multi-node launch: node 0
(`--nnodes 2 --node-rank 0 --master-addr <node0's address> --master-port P --tensor-parallel-size 2`) serves the API
and runs TP rank 0, node 1 (the same with `--node-rank 1 --headless`) runs TP rank 1. Each node is a network
namespace (`ascend_testkit.hosts.Topology`) joined to the other by a veth pair, both in the simulated-NPU lane, each
with what a user sets on each machine (`VLLM_HOST_IP`, `GLOO_SOCKET_IFNAME`: `ascend_testkit.host_servers.node_env`).

Which path the all-reduce takes: vLLM's CPU communicator all-reduces through shared memory only when every rank of
the group derives the same shared-memory group name, which includes `VLLM_DIST_IDENT`, taken from the node's own
rendezvous file name (a fresh uuid per node). The namespaces here share /dev/shm (only the network differs), yet the
names differ per node, so vLLM takes the multi-host path, as on two machines: torch.distributed's gloo over TCP
across the link (vLLM logs it on both nodes). The test shows it from the bytes too: each node sends the other at
least the activations of the TP all-reduces of a prefill, which shared memory would not have put on the wire.

Answers equal the single engine's (the same model in the same lane, tensor_parallel_size=1; the tiny Llama is
float32: the same greedy tokens, logprobs within float rounding); both ranks ran our platform (the API's
`collective_rpc` reaches node 1's worker, whose process lives in node 1's namespace).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from ascend_testkit.compare import assert_greedy_equals_single
from ascend_testkit.models.tiny_llama import TinyModelSpec, prompt_of_length
from ascend_testkit.servers import ServerProcess, inside

pytestmark = [pytest.mark.engine]

API_PORT = 8300
MASTER_PORT = 29650
MAX_TOKENS = 10
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1,
          "extra_body": {"ignore_eos": True, "return_token_ids": True}}
# The single engine: `ascend_testkit.servers.tiny_serve_args` as engine arguments.
ENGINE = dict(dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=16, seed=0)
LENGTHS = [5, 40, 129]
LOGPROB_TOL = 1e-4
SPEC = TinyModelSpec()
# Row-parallel layers end in a TP all-reduce of the hidden states (float32): o_proj and down_proj in every layer.
ALL_REDUCE_BYTES_PER_TOKEN = SPEC.num_layers * 2 * SPEC.hidden_size * 4
# vLLM's CPU communicator, when the group's ranks do not agree on a shared-memory group name.
GLOO_PATH_LOG = "CPU SHM communicator disabled for group tp"


@dataclass
class TpAcrossHosts:
    topo: object
    node0: ServerProcess  # API server, TP rank 0
    node1: ServerProcess  # headless, TP rank 1
    single: dict  # the single engine's greedy outputs for PROMPTS

    def client(self, server: ServerProcess):
        return server.openai_client(120.0)


PROMPTS = [prompt_of_length(n, offset=300 + n) for n in LENGTHS]


@pytest.fixture(scope="module")
def tp_hosts(tmp_path_factory, tiny_model, node_topo, lane_outputs):
    from ascend_testkit.host_servers import node_cpus, start_tp_node_on, two_nodes

    logs = tmp_path_factory.mktemp("multihost-tp")
    cpus = node_cpus()
    node = dict(master=node_topo["node0"], master_port=MASTER_PORT, nnodes=2, tensor_parallel_size=2, log_dir=logs,
                env_extra={"VLLM_SERVER_DEV_MODE": "1"})  # its /collective_rpc asks both ranks what ran

    def start(rank: int) -> ServerProcess:
        return start_tp_node_on(node_topo[f"node{rank}"], f"node{rank}", tiny_model, API_PORT,
                                peer=f"node{1 - rank}", node_rank=rank, cpu=cpus[rank], **node)

    # node 0 is healthy only once node 1's worker joined the TP group
    with two_nodes(start, lambda: lane_outputs(tiny_model, ENGINE, PROMPTS, MAX_TOKENS)) as (node0, node1, outputs):
        print(f"TP=2 across hosts healthy after {node0.ready_after_s:.0f} s")
        yield TpAcrossHosts(node_topo, node0, node1, outputs)


@pytest.fixture
def tp(tp_hosts):
    """The servers, with this test's thread on node0's host (the client's place)."""
    with inside(tp_hosts.topo["node0"]):
        yield tp_hosts


def test_completions_across_hosts_equal_a_single_engines(tp):
    across = tp.client(tp.node0)
    for n, prompt, single in zip(LENGTHS, PROMPTS, tp.single, strict=True):
        ours = across.completions.create(model="tiny", prompt=prompt, **GREEDY).choices[0]
        assert_greedy_equals_single(ours, single, MAX_TOKENS, LOGPROB_TOL, f"{n}-token prompt")
    # Streamed: the same tokens, chunk by chunk.
    stream = across.completions.create(model="tiny", prompt=PROMPTS[1], stream=True, max_tokens=MAX_TOKENS,
                                       temperature=0, extra_body={"ignore_eos": True})
    chunks = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    assert len(chunks) > 1 and "".join(chunks) == tp.single[1]["text"]


def test_the_tp_all_reduce_crosses_the_link_over_gloo(tp):
    # Both nodes' workers fell back from vLLM's shared-memory all-reduce to torch.distributed (gloo over TCP) ...
    for server in (tp.node0, tp.node1):
        assert GLOO_PATH_LOG in server.log_path.read_text(errors="replace"), server.name
    # ... and the all-reduce's activations went over the link both ways: a fresh prefill of n tokens (one decode
    # step besides) moves at least the row-parallel layers' hidden states of every token each way.
    n = 300
    node0, node1 = tp.topo["node0"], tp.topo["node1"]
    sent0, sent1 = node0.bytes_sent("node1"), node1.bytes_sent("node0")
    out = tp.client(tp.node0).completions.create(model="tiny", prompt=prompt_of_length(n, offset=4000), max_tokens=1,
                                                 temperature=0)
    assert out.usage.prompt_tokens == n
    crossed = node0.bytes_sent("node1") - sent0, node1.bytes_sent("node0") - sent1
    print(f"a {n}-token prefill sent node0->node1 {crossed[0]} B, node1->node0 {crossed[1]} B "
          f"(all-reduce payload {n * ALL_REDUCE_BYTES_PER_TOKEN} B)")
    assert min(crossed) >= n * ALL_REDUCE_BYTES_PER_TOKEN, crossed


def test_both_nodes_workers_run_the_ascend_platform(tp):
    usage = tp.node0.collective_rpc("ascend_usage")
    assert len(usage) == 2, "collective_rpc reached one rank only"
    for rank, report in enumerate(usage):
        assert report["facts"]["runner_class"].startswith("ascend_platform.worker."), rank
        assert report["attention_impls"] == ["AscendAttentionImpl"], rank
        assert report["counts"]["attention.ascend.forward"] > 0, rank
    # Rank 1 is node 1's worker: a live process of node 1's headless server, in node 1's network namespace.
    log = tp.node1.log_path.read_text(errors="replace")
    assert "headless multiproc executor" in log
    pids = {int(p) for p in re.findall(r"\(Worker pid=(\d+)\)", log)}
    assert pids, "node 1 started no worker"
    node1_net = os.readlink(f"/proc/{tp.topo['node1'].pid}/ns/net")
    for pid in pids:
        assert Path(f"/proc/{pid}").exists(), f"node 1's worker {pid} is gone"
        assert os.readlink(f"/proc/{pid}/ns/net") == node1_net
    assert node1_net != os.readlink(f"/proc/{tp.topo['node0'].pid}/ns/net")
