"""The KV pool across hosts: `mooncake_master` on host "master", two `ascend-vllm serve` engines with
`AscendStoreConnector` on hosts "a" and "b" (each its own PYTHONHASHSEED), every pair of hosts linked
(`ascend_testkit.hosts.Topology`). Each engine reaches the master on the master's own address and advertises its own
host's address to the pool (`ascend_testkit.host_pool`).

A prompt engine A computed and saved is served by engine B from the pool: B's answer equals A's (computed from
scratch), B took the prompt's full blocks from the connector (vLLM's own prompt-token counter and the connector's
loaded blocks) and their bytes crossed the a-b link (whichever segment the master put them in, they go from A's host
to B's: A writes them into B's segment or B reads them from A's).
"""

from __future__ import annotations

import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length
from ascend_testkit.servers import wait_for

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

PORT = 8000  # each engine on its own host: the same port on both
BLOCK = 128
# The tiny Llama's KV per token: 2 layers x (K, V) x 2 heads x 32 dims x 4 bytes (float32).
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4
FULL_BLOCKS = 3
PROMPT_TOKENS = FULL_BLOCKS * BLOCK + 40  # the partial last block is not pooled
GREEDY = {"max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
CONNECTOR = "ascend_store_connector"  # the connector's prefix in /metrics (`ascend_kv_transfer.stats`)


@pytest.fixture(scope="module")
def pool_hosts(tmp_path_factory, tiny_model):
    from ascend_testkit.host_pool import host_pool_config, start_master_on
    from ascend_testkit.host_servers import start_serve_on
    from ascend_testkit.hosts import Topology
    from ascend_testkit.netns import NetnsUnavailableError

    logs = tmp_path_factory.mktemp("pool-across-hosts")
    try:
        topo = Topology(["master", "a", "b"])
    except NetnsUnavailableError as e:
        pytest.fail(f"needs network namespaces (root, util-linux, iproute2): {e}")
    servers = []
    master = None
    try:
        master = start_master_on(topo["master"], logs / "master.log")
        for cpu, (name, seed) in enumerate((("a", "1"), ("b", "2"))):
            host = topo[name]
            servers.append(start_serve_on(host, f"pool-{name}", tiny_model, PORT, log_dir=logs, cpu=cpu,
                                          kv_transfer_config=host_pool_config(host, master),
                                          env_extra={"PYTHONHASHSEED": seed}))
        for server in servers:
            server.wait_healthy()
        yield topo, master, servers[0], servers[1]
    finally:
        for server in servers:
            server.close()
        if master is not None:
            master.close()
        topo.close()
    leftovers = [s.name for s in servers if s.alive]
    assert not leftovers, f"servers still running: {leftovers}"


def _metrics(server) -> str:
    status, body = server.get("/metrics", timeout=30)
    assert status == 200, (server.name, status)
    return body.decode()



def _counter(server, key: str) -> float:
    from ascend_testkit.host_pool import connector_counter

    return connector_counter(_metrics(server), CONNECTOR, key)


def _complete(server, prompt: str) -> str:
    from ascend_testkit.servers import inside

    with inside(server.netns):
        return server.openai_client().completions.create(model="tiny", prompt=prompt, **GREEDY).choices[0].text



def test_engines_reach_the_master_on_its_own_host(pool_hosts):
    topo, master, a, b = pool_hosts
    assert master.address == f"{topo['master'].address}:27051" and not master.address.startswith("127.")
    # The store clients talked to the master over their links (the only way to its address).
    assert topo["a"].bytes_sent("master") > 0 and topo["b"].bytes_sent("master") > 0


def test_prefix_saved_by_one_host_loads_on_another(pool_hosts):
    topo, _, a, b = pool_hosts
    prompt = prompt_of_length(PROMPT_TOKENS, offset=301)
    wire_before = topo["a"].bytes_sent("b")
    loaded_before, external_before = _counter(b, "blocks_loaded"), b.kv_received_tokens()
    stored_before = _counter(a, "objects_stored")

    computed = _complete(a, prompt)  # A computes it from scratch and saves its full blocks to the pool
    saved_in = wait_for(lambda: _counter(a, "objects_stored") - stored_before >= FULL_BLOCKS, 30, "A's saves reported")
    from_pool = _complete(b, prompt)

    assert from_pool == computed
    assert b.kv_received_tokens() - external_before == FULL_BLOCKS * BLOCK
    assert _counter(b, "blocks_loaded") - loaded_before == FULL_BLOCKS
    crossed = topo["a"].bytes_sent("b") - wire_before
    assert crossed >= FULL_BLOCKS * BLOCK * KV_BYTES_PER_TOKEN, crossed
    print(f"A's saves reported {saved_in:.1f} s after its answer; {crossed} B crossed a->b")


def test_prefix_saved_by_the_second_host_loads_on_the_first(pool_hosts):
    """The other direction: B computes and saves, A loads."""
    _, _, a, b = pool_hosts
    prompt = prompt_of_length(2 * BLOCK + 10, offset=777)
    external_before, stored_before = a.kv_received_tokens(), _counter(b, "objects_stored")
    computed = _complete(b, prompt)
    wait_for(lambda: _counter(b, "objects_stored") - stored_before >= 2, 30, "B's saves reported")
    assert _complete(a, prompt) == computed
    assert a.kv_received_tokens() - external_before == 2 * BLOCK
