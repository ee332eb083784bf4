"""Tensor parallelism across two hosts through vLLM's Ray executor, as a user runs it: a Ray head on node 0 (`ray start
--head --node-ip-address <node0's address> --resources '{"NPU": 1}'`), a Ray worker node on node 1 joining it (`ray
start --address <node0's address>:<port> --resources '{"NPU": 1}'`), then `ascend-vllm serve MODEL
--distributed-executor-backend ray --tensor-parallel-size 2` on node 0 (`RAY_ADDRESS` names the head). vLLM's Ray
executor asks a placement group of two `NPU` bundles (our platform's `ray_device_key`), so one TP rank lands on each
host: rank 0 beside the server, rank 1 a Ray actor on node 1. Each node is a network namespace
(`ascend_testkit.hosts.Topology`) joined to the other by a veth pair, in the simulated-NPU lane; the Ray nodes are
`ascend_testkit.ray_cluster`'s.

Answers equal the single engine's (the same model in the same lane, tensor_parallel_size=1, as the mp TP test holds
its deployment to), both ranks ran our platform, each node's namespace holds one of vLLM's Ray workers, and the TP
all-reduce crossed the link. Losing node 1 (its raylet and worker killed at once) ends the server's requests with an
error, or the server, within a bound: nothing hangs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

from ascend_testkit.compare import assert_greedy_equals_single
from ascend_testkit.models.tiny_llama import TinyModelSpec, prompt_of_length
from ascend_testkit.servers import ServerProcess, inside, tiny_serve_args

pytestmark = [pytest.mark.engine]

API_PORT = 8310
MAX_TOKENS = 10
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1,
          "extra_body": {"ignore_eos": True, "return_token_ids": True}}
# The single engine: `ascend_testkit.servers.tiny_serve_args` as engine arguments (as test_tp_across_hosts).
ENGINE = dict(dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=16, seed=0)
LENGTHS = [5, 40, 129]  # across the 128-token block edge
PROMPTS = [prompt_of_length(n, offset=300 + n) for n in LENGTHS]
LOGPROB_TOL = 1e-4
SPEC = TinyModelSpec()
ALL_REDUCE_BYTES_PER_TOKEN = SPEC.num_layers * 2 * SPEC.hidden_size * 4
# vLLM's CPU communicator, when the group's ranks do not agree on a shared-memory group name.
GLOO_PATH_LOG = "CPU SHM communicator disabled for group tp"
# Its /collective_rpc asks both ranks what ran; every worker's log line reaches the server's log (Ray otherwise folds
# lines repeated across workers into one).
DRIVER_ENV = {"VLLM_SERVER_DEV_MODE": "1", "RAY_DEDUP_LOGS": "0"}
RAY_ARGS = ["--distributed-executor-backend", "ray", "--tensor-parallel-size", "2"]
# Node 1 lost: Ray's GCS declares a silent node dead after its health checks fail (~30 s by default), then vLLM's
# Ray executor's worker monitor (a 5 s poll) shuts the engine down.
NODE_LOST_BOUND_S = 120.0


@dataclass
class RayAcrossHosts:
    topo: object
    cluster: object  # ascend_testkit.ray_cluster.RayCluster
    server: ServerProcess
    single: list[dict]


@pytest.fixture(scope="module")
def ray_hosts(tmp_path_factory, tiny_model, node_topo, lane_outputs):
    from ascend_testkit.host_servers import node_cpus, start_serve_on
    from ascend_testkit.ray_cluster import RayCluster

    logs = tmp_path_factory.mktemp("multihost-ray")
    cpus = node_cpus()
    node0 = node_topo["node0"]
    cluster = RayCluster([node0, node_topo["node1"]], log_dir=logs, cpus=list(cpus))
    server = None
    try:
        cluster.wait_nodes(2, timeout=120)
        server = start_serve_on(node0, "ray-serve", tiny_model, API_PORT, log_dir=logs, cpu=int(cpus[0].split(",")[0]),
                                args=[*tiny_serve_args(), *RAY_ARGS],
                                env_extra={**cluster.driver_env(node0, "node1"), **DRIVER_ENV})
        single = lane_outputs(tiny_model, ENGINE, PROMPTS, MAX_TOKENS)  # while the Ray workers come up
        t0 = time.monotonic()
        server.wait_healthy(timeout=600)
        print(f"Ray TP=2 across hosts healthy {time.monotonic() - t0:.0f} s after the single engine's answers")
        yield RayAcrossHosts(node_topo, cluster, server, single)
    finally:
        if server is not None:
            server.close()
        cluster.stop()
    assert server is None or not server.alive, "the Ray-backed server is still running"
    assert not cluster.leftovers(), f"Ray processes still running: {cluster.leftovers()}"


@pytest.fixture
def ray_tp(ray_hosts):
    """The deployment, with this test's thread on node0's host (the client's place)."""
    with inside(ray_hosts.topo["node0"]):
        yield ray_hosts


def test_completions_through_ray_equal_a_single_engines(ray_tp):
    client = ray_tp.server.openai_client(120.0)
    for n, prompt, single in zip(LENGTHS, PROMPTS, ray_tp.single, strict=True):
        ours = client.completions.create(model="tiny", prompt=prompt, **GREEDY).choices[0]
        assert_greedy_equals_single(ours, single, MAX_TOKENS, LOGPROB_TOL, f"{n}-token prompt")


def test_each_host_runs_one_ray_worker_of_the_ascend_platform(ray_tp):
    # One of vLLM's Ray workers (a `ray::RayWorkerProc` actor process) on each host, in that host's namespace.
    head, worker = ray_tp.cluster.nodes
    nets = {}
    for node in (head, worker):
        pids = node.worker_pids()
        assert len(pids) == 1, (node.name, pids)
        nets[node.name] = os.readlink(f"/proc/{pids[0]}/ns/net")
        assert nets[node.name] == os.readlink(f"/proc/{node.host.pid}/ns/net"), node.name
    assert nets[head.name] != nets[worker.name]
    # Ray's own view: both NPUs of the cluster held.
    assert "2.0/2.0 NPU" in ray_tp.cluster.status()
    # Both ranks ran our platform's worker and attention.
    usage = ray_tp.server.collective_rpc("ascend_usage")
    assert len(usage) == 2, "collective_rpc reached one rank only"
    for rank, report in enumerate(usage):
        assert report["facts"]["runner_class"].startswith("ascend_platform.worker."), rank
        assert report["attention_impls"] == ["AscendAttentionImpl"], rank
        assert report["counts"]["attention.ascend.forward"] > 0, rank
    # And the TP all-reduce's activations crossed the link both ways: both ranks fell back from vLLM's shared-memory
    # all-reduce (shared memory is per host) to gloo over TCP between the hosts (Ray forwards the workers' logs).
    assert ray_tp.server.log_path.read_text(errors="replace").count(GLOO_PATH_LOG) >= 2
    n = 300
    node0, node1 = ray_tp.topo["node0"], ray_tp.topo["node1"]
    sent0, sent1 = node0.bytes_sent("node1"), node1.bytes_sent("node0")
    out = ray_tp.server.openai_client(120.0).completions.create(model="tiny", prompt=prompt_of_length(n, offset=4000),
                                                                max_tokens=1, temperature=0)
    assert out.usage.prompt_tokens == n
    crossed = node0.bytes_sent("node1") - sent0, node1.bytes_sent("node0") - sent1
    print(f"a {n}-token prefill sent node0->node1 {crossed[0]} B, node1->node0 {crossed[1]} B")
    assert min(crossed) >= n * ALL_REDUCE_BYTES_PER_TOKEN, crossed


def test_a_lost_ray_node_fails_requests_within_a_bound(ray_tp):
    """Last in the module: it takes node 1 away."""
    import openai

    ray_tp.cluster.nodes[1].kill()
    t0 = time.monotonic()
    client = ray_tp.server.openai_client(NODE_LOST_BOUND_S)
    error = None
    try:
        client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"ignore_eos": True})
    except (openai.APIError, openai.APIConnectionError) as e:
        error = e
    failed_after = time.monotonic() - t0
    print(f"node 1 lost: the request ended after {failed_after:.1f} s with {type(error).__name__}: {error}")
    assert error is not None, "a request answered with half the TP group gone"
    assert failed_after < NODE_LOST_BOUND_S
    # The engine is gone: the server reports unhealthy or exits, within the bound.
    deadline = t0 + NODE_LOST_BOUND_S
    while time.monotonic() < deadline:
        if not ray_tp.server.alive:
            break
        try:
            if ray_tp.server.get("/health", timeout=5)[0] != 200:
                break
        except OSError:
            break
        time.sleep(1.0)
    else:
        raise AssertionError(f"the server still healthy {NODE_LOST_BOUND_S} s after node 1 was lost")
    # Named: rank 0's collective lost its peer (gloo's read reset by node 1), and vLLM declared the engine dead.
    log = ray_tp.server.log_path.read_text(errors="replace")
    assert "EngineDeadError" in log, ray_tp.server.log_tail(60)


def test_the_device_platform_keeps_ray_off_the_npus_visible_devices():
    """Not run on a card here (no multi-NPU host): on one, Ray would narrow each worker's ASCEND_RT_VISIBLE_DEVICES
    to its bundle's NPU while vLLM picks the device by local rank. The device platform names the variable Ray's NPU
    manager reads to leave it alone, and the variable it would narrow is the one the platform controls."""
    from ray._private.accelerators.npu import NOSET_ASCEND_RT_VISIBLE_DEVICES_ENV_VAR, NPUAcceleratorManager

    from ascend_platform.npu_platform import AscendNPUPlatform

    assert NOSET_ASCEND_RT_VISIBLE_DEVICES_ENV_VAR in AscendNPUPlatform.ray_noset_device_env_vars
    assert NPUAcceleratorManager.get_visible_accelerator_ids_env_var() == AscendNPUPlatform.device_control_env_var
    assert NPUAcceleratorManager.get_resource_name() == AscendNPUPlatform.ray_device_key
