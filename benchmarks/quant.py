"""Quantization benchmark: W8A8 decode on our simulated lane against plain vLLM CPU, the reference int8 matmul
against vLLM's oneDNN int8 GEMM, and the memory the int8 linears keep.

- w8a8_decode_ratio: decode tokens/s of the compressed-tensors W8A8 (dynamic) tiny Llama, our simulated lane
  (`ascend_testkit.decode_timing.measure_decode`, bfloat16) / plain vLLM CPU on the same checkpoint (goal >= 0.5).
- int8_matmul_ratio: `ascend_kernels.ops.quant_matmul` (reference backend, checks off) / vLLM's
  `onednn_scaled_mm` (its CPU int8 W8A8 kernel, the handler built as vLLM's CPUInt8ScaledMMLinearKernel builds it),
  per-token activation scales and per-channel weight scales, bfloat16 output, on 4096 x 4096 weights; the worst of a
  decode batch (M = 32) and a prefill chunk (M = 256) (goal <= 2). Best of N interleaved repetitions.
- weight_memory_ratio: bytes of the loaded linear weights of the W8A8 model / of the float (bfloat16) model, both
  read from our worker after loading (goal < 0.6).

Prints ONE JSON object as the last line of stdout (logs on stderr).

Usage: uv run python benchmarks/quant.py [--repeats 20] [--max-tokens 64] [--threads N]

On a loaded machine with 2 threads each parallel torch op may wait a scheduler slice at its OpenMP barrier, which
hits the several-op reference far harder than oneDNN's single call; `--threads 1` measures the work itself (the
matmul part only: the engines keep their own threads).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import torch
from kernels import best_ms  # the same interleaved best-of-N timing as the kernel benchmarks (this folder)

K = N = 4096
M_SHAPES = (32, 256)
ENGINE = dict(dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def int8_matmul(repeats: int) -> dict:
    from vllm import _custom_ops as vllm_ops

    import ascend_kernels
    from ascend_kernels import ops

    ascend_kernels.set_backend("reference")
    ascend_kernels.set_validation(False)
    g = torch.Generator().manual_seed(0)
    w_rows = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)  # the checkpoint's [N, K]
    w_scale = torch.rand(N, generator=g) * 1e-3
    handler = vllm_ops.create_onednn_scaled_mm(w_rows.t(), w_scale.reshape(N, 1), torch.bfloat16, True, False, 32)
    shapes = []
    for m in M_SHAPES:
        x = torch.randint(-128, 128, (m, K), generator=g, dtype=torch.int8)
        x_s = torch.rand(m, 1, generator=g)
        out = torch.empty(m, N, dtype=torch.bfloat16)
        ours = ops.quant_matmul(x, w_rows.t(), w_scale, pertoken_scale=x_s.reshape(m), output_dtype=torch.bfloat16)
        vllm_ops.onednn_scaled_mm(handler, x, out, x_s, None, None, None)
        err = (ours.float() - out.float()).abs().max().item() / out.float().abs().max().item()
        ms = best_ms({"reference": lambda x=x, x_s=x_s: ops.quant_matmul(
                          x, w_rows.t(), w_scale, pertoken_scale=x_s.reshape(-1), output_dtype=torch.bfloat16),
                      "onednn": lambda x=x, x_s=x_s, out=out: vllm_ops.onednn_scaled_mm(
                          handler, x, out, x_s, None, None, None)}, repeats)
        shapes.append({"m": m, "k": K, "n": N, "ref_ms": round(ms["reference"], 3),
                       "onednn_ms": round(ms["onednn"], 3), "ratio": round(ms["reference"] / ms["onednn"], 3),
                       "max_rel_diff": round(err, 5)})
        log(f"int8 matmul M={m}: {shapes[-1]}")
    return {"int8_matmul_ratio": max(s["ratio"] for s in shapes), "int8_matmul": shapes}


def engines(max_tokens: int) -> dict:
    from ascend_testkit.decode_timing import measure_decode
    from ascend_testkit.engine import HostPool
    from ascend_testkit.models.quantized import QuantizedSpec, cached_quantized_llama
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    w8a8 = str(cached_quantized_llama(QuantizedSpec(fmt="compressed-tensors", activations="dynamic")))
    float_model = str(cached_tiny_llama())
    pool = HostPool(tempfile.mkdtemp(prefix="quant-bench-"))
    try:
        ours, cpu = pool.get("sim", lane="simulated"), pool.get("cpu", lane="cpu", runner="v1")
        cpu.start(w8a8, **ENGINE)
        theirs = measure_decode(cpu, max_tokens)
        cpu.stop()
        ours.start(w8a8, **ENGINE)
        mine = measure_decode(ours, max_tokens)
        quant_linears = ours.rpc("ascend_testkit.quant_probes:linear_weights")[0]
        ours.stop()
        ours.start(float_model, **ENGINE)
        float_linears = ours.rpc("ascend_testkit.quant_probes:linear_weights")[0]
        ours.stop()
    finally:
        pool.close()
    q_bytes = sum(v["bytes"] for v in quant_linears.values())
    f_bytes = sum(v["bytes"] for v in float_linears.values())
    log(f"decode ours {mine['decode_tok_s']:.1f} tok/s, vLLM CPU {theirs['decode_tok_s']:.1f} tok/s")
    return {"w8a8_decode_ratio": round(mine["decode_tok_s"] / theirs["decode_tok_s"], 3),
            "decode_tok_s": {"ours": round(mine["decode_tok_s"], 1), "vllm_cpu": round(theirs["decode_tok_s"], 1)},
            "our_kernels_s": mine.get("our_kernels_s"),
            "weight_memory_ratio": round(q_bytes / f_bytes, 3),
            "linear_weight_bytes": {"w8a8": q_bytes, "bfloat16": f_bytes, "w8a8_methods": quant_linears}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {**int8_matmul(args.repeats), **engines(args.max_tokens), "threads": torch.get_num_threads()}
    result["goals"] = {"w8a8_decode_ratio >= 0.5": result["w8a8_decode_ratio"] >= 0.5,
                       "int8_matmul_ratio <= 2": result["int8_matmul_ratio"] <= 2,
                       "weight_memory_ratio < 0.6": result["weight_memory_ratio"] < 0.6}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
