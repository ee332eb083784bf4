"""KV transfer benchmark: our Mooncake P2P connector against the raw TransferEngine, offloading against torch copy,
and the two-engine time-to-landed-KV against vLLM's in-tree MooncakeConnector.

The synthetic pull (`StepDriver.pull`) runs the hand-off protocol (`p2p.handoff`) through the step driver a decode
engine runs (`p2p.step_driver`), large reads on its background thread as in an engine, so connector_gib_s measures
the engine's path; the two-engine figures are real engines.

Everything runs inside a loopback-only network namespace (root needed). Prints logs to stderr and ONE JSON object as
the last line of stdout with keys connector_gib_s, raw_gib_s, ratio, transfer_ops_per_request, max_ops_allowed,
offload_ratio, landed_ms, peer_landed_ms (and details). Goals: ratio >= 0.9, transfer_ops_per_request <=
max_ops_allowed, offload_ratio >= 0.8, landed_ms <= peer_landed_ms.

    python benchmarks/kv_transfer.py [--repeats 5] [--skip-engines]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LAYERS, BLOCKS, PAGE = 32, 256, 64 << 10
RUN = 16  # blocks per contiguous run of the synthetic request
PRODUCER_PORT = 33100
PROMPT_TOKENS = 900


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def _layers(fill: int):
    """32 per-layer [blocks, page] views into one buffer (layer-major, like vLLM's LBHNC allocation)."""
    import torch

    raw = torch.full((LAYERS * BLOCKS * PAGE,), fill, dtype=torch.uint8)
    return raw, {f"model.layers.{i}.attn": raw[i * BLOCKS * PAGE:(i + 1) * BLOCKS * PAGE].view(BLOCKS, PAGE)
                 for i in range(LAYERS)}


def _request_blocks() -> tuple[list[int], list[int]]:
    """Local ids: 16-block runs in reverse run order; remote ids: 0..255 (so 16 contiguous runs)."""
    runs = [list(range(r * RUN, (r + 1) * RUN)) for r in range(BLOCKS // RUN)]
    local = [b for run in reversed(runs) for b in run]
    return local, list(range(BLOCKS))


def contiguous_runs(local: list[int], remote: list[int]) -> int:
    """Runs of consecutive positions where both block ids go up by one: the fewest transfers that can move them."""
    return 1 + sum(1 for i in range(1, len(local)) if local[i] != local[i - 1] + 1 or remote[i] != remote[i - 1] + 1)


def _geometry():
    from ascend_kv_transfer.p2p.schema import KVGeometry

    return KVGeometry(block_size=128, dtype="uint8", num_kv_heads=1, head_size=PAGE, layout="LBHNC")


# ---- synthetic producer / consumer (run inside the namespace) ---------------------------------------------------
def synthetic_producer(repeats: int, host: str = "127.0.0.1", port: int = PRODUCER_PORT) -> None:
    """Holds `repeats + 1` copies of the synthetic request for the consumer; its side channel on `host:port`."""
    import torch

    from ascend_kv_transfer.kv_regions import describe_kv_caches
    from ascend_kv_transfer.options import MooncakeOptions
    from ascend_kv_transfer.p2p.agent import MooncakeAgent

    raw, layers = _layers(7)
    for i in range(LAYERS):  # a recognisable pattern: every page starts with its layer and block number
        layers[f"model.layers.{i}.attn"][:, 0] = i
        layers[f"model.layers.{i}.attn"][:, 1] = torch.arange(BLOCKS, dtype=torch.uint8)
    agent = MooncakeAgent(engine_id="bench-producer", geometry=_geometry(),
                          options=MooncakeOptions(side_channel_host=host, side_channel_port=port, abort_timeout_s=600))
    agent.register(describe_kv_caches(layers))
    agent.serve(port)
    _, remote = _request_blocks()
    for i in range(repeats + 1):
        agent.holds.hold(f"bench-{i}", f"req-{i}", [remote])
    print(json.dumps({"ready": True, "rpc_port": agent.engine.rpc_port}), flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
    agent.close()
    del raw


def synthetic_consumer(repeats: int, host: str = "127.0.0.1", peer_host: str = "127.0.0.1",
                       port: int = PRODUCER_PORT, offload: bool = True) -> None:
    """Pulls the producer's request (at `peer_host:port`) through the connector and through raw Mooncake, interleaved;
    with `offload`, also times the host tier. Prints the figures as one JSON line."""
    import torch

    from ascend_kv_transfer.kv_regions import describe_kv_caches
    from ascend_kv_transfer.offload.host_tier import HostTier
    from ascend_kv_transfer.options import MooncakeOptions
    from ascend_kv_transfer.p2p.agent import MooncakeAgent
    from ascend_kv_transfer.p2p.geometry import match_regions
    from ascend_kv_transfer.p2p.plan import build_entries, coalesce_runs
    from ascend_kv_transfer.p2p.step_driver import StepDriver

    raw, layers = _layers(0)
    agent = MooncakeAgent(engine_id="bench-consumer", geometry=_geometry(),
                          options=MooncakeOptions(side_channel_host=host))
    regions = describe_kv_caches(layers)
    agent.register(regions)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ascend-kv-pull")
    driver = StepDriver(agent, pool, inline_read_max_bytes=agent.options.inline_read_max_bytes)
    local, remote = _request_blocks()
    address = (peer_host, port)
    warm = driver.pull(address, "bench-0", [local])  # handshake + first-touch costs
    assert warm.ok, warm.error
    l0 = layers["model.layers.3.attn"]
    assert int(l0[local[5], 0]) == 3 and int(l0[local[5], 1]) == remote[5], "pulled bytes are not the peer's pages"
    # Raw engine: the same bytes, one batched call with one entry per contiguous run (the best the engine offers).
    meta = agent.peers.known(address)  # met in the warm-up's handshake
    entries = build_entries(match_regions(regions.regions, meta), coalesce_runs(local, remote))
    peer = f"{peer_host}:{meta.rpc_port}"
    times, raw_times, result = [], [], warm
    for i in range(1, repeats + 1):  # interleaved, so both see the same machine load and link
        result = driver.pull(address, f"bench-{i}", [local])
        assert result.ok, result.error
        times.append(result.seconds)
        t = time.perf_counter()
        ret = agent.engine.engine.batch_transfer_sync_read(peer, entries.local, entries.remote, entries.lengths)
        raw_times.append(time.perf_counter() - t)
        assert ret == 0, ret
    nbytes = result.nbytes
    num_runs = contiguous_runs(local, remote)

    gib = nbytes / (1 << 30)
    # Best of the interleaved repeats: on a shared, noisy machine the fastest run is the reproducible one.
    figures = {
        "bytes_per_request": nbytes,
        "connector_s": min(times), "raw_s": min(raw_times),
        "connector_gib_s": gib / min(times), "raw_gib_s": gib / min(raw_times),
        "connector_median_gib_s": gib / statistics.median(times),
        "raw_median_gib_s": gib / statistics.median(raw_times),
        "connector_s_all": times, "raw_s_all": raw_times,
        "transfer_ops_per_request": result.entries, "transfer_calls_per_request": result.calls,
        # Independent of the code under test: one entry per run of blocks contiguous on both sides, per layer
        # (each of the LAYERS synthetic layers is one contiguous [blocks, page] region by construction).
        "max_ops_allowed": num_runs * LAYERS, "contiguous_runs": num_runs,
        "registered_regions": len(regions.regions), "registered_storages": len(regions.storages),
    }
    if offload:
        # Offloading: store/load the same request through the host tier against one plain torch copy of the bytes.
        tier = HostTier(layers, num_slots=BLOCKS)
        slots = list(range(BLOCKS))
        src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
        copy_t, save_t, load_t = [], [], []
        for _ in range(max(repeats, 12)):  # ~25 ms each: cheap to repeat until the best is stable
            t = time.perf_counter()
            dst.copy_(src)
            copy_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            tier.store(slots, local)
            save_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            tier.load(slots, local)
            load_t.append(time.perf_counter() - t)
        figures.update({"offload_save_gib_s": gib / min(save_t), "offload_load_gib_s": gib / min(load_t),
                        "torch_copy_gib_s": gib / min(copy_t)})
    print(json.dumps(figures), flush=True)
    driver.close()
    pool.shutdown()
    agent.close()
    del raw


def run_synthetic(ns, repeats: int, logdir: Path) -> dict:
    me = [sys.executable, str(Path(__file__).resolve())]
    return run_producer_and_consumer(
        lambda **popen: ns.popen([*me, "--synthetic-producer", "--repeats", str(repeats)], **popen),
        ns.command([*me, "--synthetic-consumer", "--repeats", str(repeats)]), logdir)


def run_producer_and_consumer(start_producer, consumer_cmd: list[str], logdir: Path) -> dict:
    """Start the producer (`start_producer(**popen_kwargs)`), wait for its ready line, run the consumer command to its
    end, and return the consumer's JSON line; the producer ends when its stdin closes. Logs go to `logdir`."""
    plog = open(logdir / "producer.log", "wb")  # noqa: SIM115
    producer = start_producer(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=plog)
    try:
        hello = json.loads(producer.stdout.readline() or b"{}")
        if not hello.get("ready"):
            raise RuntimeError(f"synthetic producer failed (log {logdir / 'producer.log'})")
        out = subprocess.run(consumer_cmd, capture_output=True, timeout=600, check=False)
        (logdir / "consumer.log").write_bytes(out.stderr)
        if out.returncode != 0:
            raise RuntimeError(f"synthetic consumer failed: {out.stderr.decode()[-2000:]}")
        return json.loads(out.stdout.decode().strip().splitlines()[-1])
    finally:
        producer.stdin.close()
        try:
            producer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            producer.kill()
            producer.wait(timeout=10)
        plog.close()


# ---- the two-engine flow ------------------------------------------------------------------------------------------
def _pd_configs(kind: str, port: int) -> tuple[dict, dict]:
    if kind == "ours":
        def kv(role):
            return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"ours-{role}",
                    "kv_load_failure_policy": "recompute",
                    "kv_connector_extra_config": {"side_channel_port": port}}
    else:
        def kv(role):
            return {"kv_connector": "MooncakeConnector", "kv_role": role, "engine_id": f"intree-{role}",
                    "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}
    return kv("kv_producer"), kv("kv_consumer")


def run_two_engines(ns, kind: str, model: str, ids_list: list[list[int]], logdir: Path) -> list[float]:
    from ascend_testkit.engine import EngineHost

    port = 34100 if kind == "ours" else 8998
    prod_kv, cons_kv = _pd_configs(kind, port)
    common = dict(dtype="float32", enforce_eager=True, seed=0, block_size=128, max_model_len=1024, max_num_seqs=4)
    extra = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(port)}
    setup = () if kind == "ours" else ("ascend_testkit.engine.shims:cpu_accelerator_index",)
    procs = []
    try:
        for name, kv, cpu in (("prefill", prod_kv, 0), ("decode", cons_kv, 1)):
            host = EngineHost(f"{kind}-{name}", lane="cpu", log_dir=logdir, cpus=cpu, env=extra, netns=ns,
                              setup=setup)
            procs.append(host.start(model, wait=False, kv_transfer_config=kv, **common))
        for p in procs:
            p.started()
        prefill, decode = procs
        landed = []
        for i, ids in enumerate(ids_list):
            tid = f"{kind}-xfer-{i}"
            first = prefill.run_requests([{"id": f"p{i}", "prompt_token_ids": ids, "max_tokens": 1,
                                       "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid}}])[0]
            params = first["kv_transfer_params"] or {}
            if kind != "ours":  # the router builds the decode side's params for the in-tree connector
                params = {"do_remote_prefill": True, "remote_engine_id": prod_kv["engine_id"],
                          "remote_bootstrap_addr": f"http://127.0.0.1:{port}", "transfer_id": tid}
            out = decode.run_requests([{"id": f"d{i}", "prompt_token_ids": ids, "max_tokens": 4,
                                    "kv_transfer_params": params}])[0]
            if out["t_landed"] is None:
                raise RuntimeError(f"{kind}: decode request {i} never reported its KV landed")
            landed.append((out["t_landed"] - out["t_add"]) * 1000)
            log(f"{kind}: request {i} landed after {landed[-1]:.1f} ms, tokens {out['token_ids']}")
        return landed
    finally:
        for p in procs:
            p.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=24, help="decode requests per connector (first is warm-up)")
    parser.add_argument("--skip-engines", action="store_true", help="only the synthetic and offload parts")
    parser.add_argument("--synthetic-producer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--synthetic-consumer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.synthetic_producer:
        synthetic_producer(args.repeats)
        return 0
    if args.synthetic_consumer:
        synthetic_consumer(args.repeats)
        return 0

    from ascend_testkit.netns import LoopbackNamespace

    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="kv-transfer-bench-") as tmp, LoopbackNamespace() as ns:
        logdir = Path(tmp)
        log("synthetic: 32 layers x 256 blocks x 64 KiB between two processes")
        syn = run_synthetic(ns, args.repeats, logdir)
        result.update(syn)
        result["ratio"] = syn["connector_gib_s"] / syn["raw_gib_s"]
        result["offload_ratio"] = min(syn["offload_save_gib_s"], syn["offload_load_gib_s"]) / syn["torch_copy_gib_s"]
        result["landed_ms"] = result["peer_landed_ms"] = None
        if not args.skip_engines:
            from transformers import AutoTokenizer

            from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length

            model = str(cached_tiny_llama())
            tok = AutoTokenizer.from_pretrained(model)
            ids_list = [tok(prompt_of_length(PROMPT_TOKENS, offset=31 * i))["input_ids"] for i in range(args.requests)]
            ours = run_two_engines(ns, "ours", model, ids_list, logdir)
            peer = run_two_engines(ns, "intree", model, ids_list, logdir)
            result["landed_ms"] = statistics.median(ours[1:] or ours)
            result["peer_landed_ms"] = statistics.median(peer[1:] or peer)
            result["landed_ms_all"] = ours
            result["peer_landed_ms_all"] = peer
    ordered = {k: result.pop(k) for k in ("connector_gib_s", "raw_gib_s", "ratio", "transfer_ops_per_request",
                                          "max_ops_allowed", "offload_ratio", "landed_ms", "peer_landed_ms")}
    print(json.dumps(ordered | result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
