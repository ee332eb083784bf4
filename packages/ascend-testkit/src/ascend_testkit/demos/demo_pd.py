"""`ascend-vllm demo-pd`: disaggregated prefill between two real vLLM engines over Mooncake, side by side.

A prefill engine (kv_producer, core 0) and a decode engine (kv_consumer, core 1), on our platform in the simulated-NPU
lane by default (`--lane cpu`: vLLM's own CPU platform), run in a loopback-only network
namespace with `AscendMooncakeConnector`; each prompt is first answered by the prefill engine alone (the single-engine
reference), then prefilled there and decoded on the other engine with the KV moved over Mooncake. Needs root (for the
namespace) and `mooncake-transfer-engine` (`pip install "ascend-kv-transfer[mooncake]"`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HELP = "Run prefill and decode on two vLLM engines over Mooncake and print outputs side by side with timings."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: the tiny random Llama, built offline)")
    parser.add_argument("--lengths", default="127,128,129,900", help="prompt lengths in tokens, comma separated")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--port", type=int, default=35100, help="prefill side-channel base port")
    parser.add_argument("--lane", choices=("simulated", "cpu"), default="simulated",
                        help="the engines' platform: our simulated-NPU lane (default) or vLLM's own CPU platform")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--serve", action="store_true",
                        help="as users deploy: two `ascend-vllm serve` servers and `ascend-vllm router` on loopback, "
                             "one streamed request through the router (the longest --lengths prompt)")


def _kv(role: str, port: int) -> dict:
    return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"demo-{role}",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"side_channel_port": port}}


def run(args: argparse.Namespace) -> int:
    if args.serve:
        from ascend_testkit.demos.pd_serving import run_serving

        return run_serving(args)
    from transformers import AutoTokenizer

    from ascend_testkit.engine import EngineHost
    from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length
    from ascend_testkit.netns import LoopbackNamespace

    model = args.model or str(cached_tiny_llama())
    tok = AutoTokenizer.from_pretrained(model)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    common = dict(dtype="float32", enforce_eager=True, seed=0, block_size=args.block_size,
                  max_model_len=max(lengths) + args.max_tokens + 8, max_num_seqs=4)
    rows = []
    with tempfile.TemporaryDirectory(prefix="demo-pd-") as tmp, LoopbackNamespace() as ns:
        print("starting the prefill and decode engines (about a minute) ...", file=sys.stderr, flush=True)
        procs = [EngineHost(role, lane=args.lane, log_dir=Path(tmp), cpus=i, netns=ns)
                 .start(model, wait=False, kv_transfer_config=_kv(role, args.port + 100 * i), **common)
                 for i, role in enumerate(("kv_producer", "kv_consumer"))]
        try:
            for p in procs:
                p.started()
            prefill, decode = procs
            for n in lengths:
                ids = tok(prompt_of_length(n, offset=n))["input_ids"]
                single = prefill.run_requests([{"id": f"single-{n}", "prompt_token_ids": ids,
                                            "max_tokens": args.max_tokens}])[0]
                prefill.call("reset_prefix_cache")
                first = prefill.run_requests([{"id": f"prefill-{n}", "prompt_token_ids": ids, "max_tokens": 1,
                                           "kv_transfer_params": {"do_remote_decode": True,
                                                                  "transfer_id": f"demo-{n}"}}])[0]
                out = decode.run_requests([{"id": f"decode-{n}", "prompt_token_ids": ids, "max_tokens": args.max_tokens,
                                        "kv_transfer_params": first["kv_transfer_params"]}])[0]
                rows.append({
                    "prompt_tokens": n,
                    "single_engine": tok.decode(single["token_ids"]),
                    "disaggregated": tok.decode(out["token_ids"]),
                    "identical": single["token_ids"] == out["token_ids"],
                    "single_ms": round((single["t_end"] - single["t_add"]) * 1000, 1),
                    "prefill_ms": round((first["t_end"] - first["t_add"]) * 1000, 1),
                    "kv_landed_ms": round((out["t_landed"] - out["t_add"]) * 1000, 1) if out["t_landed"] else None,
                    "decode_ms": round((out["t_end"] - out["t_add"]) * 1000, 1),
                })
            stats = decode.stats()["worker"]
        finally:
            for p in procs:
                p.close()
    if args.json:
        print(json.dumps({"rows": rows, "decode_connector": {k: v for k, v in stats.items() if k != "pulled"}}))
        return 0 if all(r["identical"] for r in rows) else 1
    for r in rows:
        same = "identical" if r["identical"] else "DIFFERENT"
        print(f"\n{r['prompt_tokens']} prompt tokens — {same}")
        print(f"  single engine  ({r['single_ms']:7.1f} ms): {r['single_engine']}")
        print(f"  prefill+decode ({r['prefill_ms']:7.1f} + {r['decode_ms']:7.1f} ms, KV landed after "
              f"{r['kv_landed_ms']} ms): {r['disaggregated']}")
    print(f"\ndecode connector: {stats['pulls_ok']} pulls, {stats['blocks_pulled']} blocks, "
          f"{stats['bytes_pulled'] / 2**20:.1f} MiB in {stats['transfer_entries']} transfer entries, "
          f"{stats['pulls_failed']} failed")
    return 0 if all(r["identical"] for r in rows) else 1
