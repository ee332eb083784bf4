"""Kernel benchmark: the reference backend of `ascend_kernels.ops` against the nearest baseline, in one run.

Baselines: vLLM's own CPU ops where they exist (`torch.ops._C.cpu_attention_with_kv_cache` for paged attention, called
exactly as vllm/v1/attention/backends/cpu_attn.py calls it, with the caches written by `cpu_attn_reshape_and_cache`
into vLLM's layout; `rms_norm`, `fused_add_rms_norm`, `rotary_embedding`, `silu_and_mul`, `mla_decode_kvcache`,
`fused_gumbel_argmax` for sampling), else plain torch. Times are the best of N interleaved repetitions (the machine
is shared and noisy).

Goals (issue 38): paged decode attention (batch 8, 1,024-token contexts, 32 query / 8 KV heads, head_dim 128, block
128, float32 and bfloat16) within 1.5x of vLLM's CPU attention op, the mixed batch (512-token prefill + 2 decodes)
within 2x; rms_norm, rms_norm + residual and rotary_embedding [64 tokens] within 1.5x of vLLM's CPU ops; the
rejection sampler (16 x 4, vocab 32,000) within 2x of the per-request loop ("goals" in the JSON); validation
overhead under 5 % of a 1-token decode step (one layer's kernel ops for one request at a 1,024-token context:
rms_norm + residual, rotary, cache write, paged attention, rms_norm + residual, silu_and_mul; no GEMMs, which would
only shrink the fraction).

Ops are timed as an engine runs them: argument checks off (the platform's `kernel_checks` defaults to false); what
the checks cost is `validation_overhead`. For bfloat16 rms_norm and rotary_embedding the row also reports
`correctly_rounded`: the fraction of each side's outputs equal to the float64 result rounded to nearest even
(torch's rounding, which the reference is held to); vLLM's CPU ops without AVX512-BF16 truncate instead (about half
their outputs one ulp off), which is less work than rounding.

Prints ONE JSON object as the last line of stdout (logs on stderr):
  {"reference_native": {"available", "reason"}: whether the reference's native loops ran (see ascend-kernels' README;
   ASCEND_VLLM_NATIVE_KERNELS=0 times the torch formulation alone),
   "ops": [{"op", "dtype", "ref_ms", "baseline", "baseline_ms", "ratio"}, ...],
   "paged_decode_ratio": <worst of float32/bfloat16>, "paged_decode_ratio_by_dtype": {...},
   "mla_decode_ratio": <our MLA decode / vLLM's CPU MLA decode op (the one its CPU_MLA backend calls), batch 8,
   1,024-token contexts, 16 heads, kv_lora_rank 512, rope 64, float32, goal <= 2>,
   "validation_overhead": <fraction>, "validation": {...}, "goals": {...}, "threads": N}

Usage: uv run python benchmarks/kernels.py [--repeats 20] [--threads N]

On a loaded machine with 2 threads each parallel torch op may wait a scheduler slice at its OpenMP barrier, which
hits the many-op reference far harder than vLLM's single-region kernels; `--threads 1` measures the work itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

import ascend_kernels
from ascend_kernels import ops
from ascend_kernels import validation as checks

B, CTX, HQ, HKV, D, BS = 8, 1024, 32, 8, 128, 128


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def best_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best time of `repeats` rounds, the candidates interleaved within each round so load hits all alike.

    The order rotates every round: whoever runs right after a candidate touching the same data finds it in cache.
    """
    for fn in fns.values():
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(ts) * 1e3 for name, ts in times.items()}


def entry(op: str, dtype: torch.dtype, t: dict[str, float], baseline: str) -> dict:
    ratio = t["ref"] / t["base"]
    log(f"{op:<28} {str(dtype):<15} ref {t['ref']:8.3f} ms  {baseline:<42} {t['base']:8.3f} ms  ratio {ratio:5.2f}")
    return {
        "op": op,
        "dtype": str(dtype).replace("torch.", ""),
        "ref_ms": round(t["ref"], 4),
        "baseline": baseline,
        "baseline_ms": round(t["base"], 4),
        "ratio": round(ratio, 3),
    }


def allocator_caches(num_blocks: int, dtype: torch.dtype, layers: int = 2):
    """K and V as the allocator builds them (the device KV layout, `ascend_core.kv.planes`): in one int8 backing, each
    layer's region holds a dense K plane, then a dense V plane, each `[num_blocks, block_size, heads, dim]`."""
    elem = torch.empty((), dtype=dtype).element_size()
    backing = torch.zeros(layers * 2 * num_blocks * BS * HKV * D * elem, dtype=torch.int8)
    typed = backing.view(dtype).view(layers, 2, num_blocks, BS, HKV, D)
    return typed[0, 0], typed[0, 1]


class PagedCase:
    """One batch on both sides: our allocator's caches and vLLM's CPU layout, holding the same K/V values."""

    def __init__(self, dtype, q_lens: list[int], ctx_lens: list[int], seed: int = 0):
        from vllm import _custom_ops as vllm_ops
        from vllm import envs
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        gen = torch.Generator().manual_seed(seed)
        self.vllm_ops, self.dtype = vllm_ops, dtype
        blocks = [-(-n // BS) for n in ctx_lens]
        self.num_blocks = sum(blocks) + 2
        self.k, self.v = allocator_caches(self.num_blocks, dtype)
        perm = torch.randperm(self.num_blocks, generator=gen)  # fragmented, as after some churn
        width = max(blocks)
        table = torch.zeros(len(ctx_lens), width, dtype=torch.int32)
        used = 0
        for r, n in enumerate(blocks):
            table[r, :n] = perm[used : used + n]
            used += n
        self.block_table = table
        self.qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
        self.seq_lens = torch.tensor(ctx_lens, dtype=torch.int32)
        self.query = torch.randn(int(self.qsl[-1]), HQ, D, generator=gen).to(dtype)
        self.scale = D**-0.5
        # Fill every context position once through our op, the same tokens through vLLM's writer.
        slots = torch.cat(
            [table[r, torch.arange(n) // BS].long() * BS + torch.arange(n) % BS for r, n in enumerate(ctx_lens)]
        )
        keys = torch.randn(slots.numel(), HKV, D, generator=gen).to(dtype)
        values = torch.randn(slots.numel(), HKV, D, generator=gen).to(dtype)
        ops.reshape_and_cache(keys, values, self.k, self.v, slots)
        self.isa = _get_attn_isa(dtype, BS, D)
        kv = torch.zeros(self.num_blocks, HKV, BS, 2 * D, dtype=dtype).view(self.num_blocks, HKV, 2 * BS, D)
        self.vk, self.vv = kv.chunk(2, dim=2)
        vllm_ops.cpu_attn_reshape_and_cache(keys, values, self.vk, self.vv, slots, self.isa)
        self.slots, self.keys, self.values = slots, keys, values
        self.meta = vllm_ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(ctx_lens),
            num_heads=HQ,
            num_kv_heads=HKV,
            head_dim=D,
            seq_lens=self.seq_lens,
            dtype=dtype,
            query_start_loc=self.qsl,
            causal=True,
            sliding_window_size=-1,
            isa=self.isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        )
        self.out = torch.empty_like(self.query)

    def ours(self):
        return ops.paged_attention(
            self.query, self.k, self.v, self.block_table, self.qsl, self.seq_lens, scale=self.scale
        )

    def vllm(self):
        self.vllm_ops.cpu_attention_with_kv_cache(
            query=self.query,
            key_cache=self.vk,
            value_cache=self.vv,
            output=self.out,
            query_start_loc=self.qsl,
            seq_lens=self.seq_lens,
            scale=self.scale,
            causal=True,
            alibi_slopes=None,
            sliding_window=-1,
            block_table=self.block_table,
            softcap=0.0,
            scheduler_metadata=self.meta,
            s_aux=None,
        )
        return self.out


def bench_paged(repeats: int) -> tuple[list[dict], dict[str, float]]:
    rows, decode = [], {}
    for dtype in (torch.float32, torch.bfloat16):
        case = PagedCase(dtype, [1] * B, [CTX] * B)
        torch.testing.assert_close(case.ours().float(), case.vllm().float(), rtol=2e-2, atol=2e-2)
        t = best_ms({"ref": case.ours, "base": case.vllm}, repeats)
        row = entry("paged_attention_decode", dtype, t, "vllm torch.ops._C.cpu_attention_with_kv_cache")
        rows.append(row)
        decode[row["dtype"]] = row["ratio"]
        t = best_ms(
            {
                "ref": lambda c=case: ops.reshape_and_cache(c.keys, c.values, c.k, c.v, c.slots),
                "base": lambda c=case: c.vllm_ops.cpu_attn_reshape_and_cache(
                    c.keys, c.values, c.vk, c.vv, c.slots, c.isa
                ),
            },
            repeats,
        )
        rows.append(entry(f"reshape_and_cache ({case.slots.numel()} tok)", dtype, t, "vllm cpu_attn_reshape_and_cache"))
    case = PagedCase(torch.float32, [512, 1, 1], [512, CTX, CTX])
    torch.testing.assert_close(case.ours(), case.vllm(), rtol=2e-3, atol=2e-3)
    t = best_ms({"ref": case.ours, "base": case.vllm}, max(3, repeats // 4))
    rows.append(
        entry("paged_attention_mixed (512+2)", torch.float32, t, "vllm torch.ops._C.cpu_attention_with_kv_cache")
    )
    return rows, decode


def bench_layers(repeats: int) -> list[dict]:
    return [row for dtype in (torch.float32, torch.bfloat16) for row in _layers_for(dtype, repeats)]


def _correctly_rounded(ours: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor) -> dict[str, float]:
    """The fraction of each side's outputs equal to the float64 result rounded to nearest even."""
    # float64 -> float32 -> bfloat16: two roundings, which differ from one only where the float32 value lands on a
    # bfloat16 tie (rare: a few outputs in a million, alike for both sides)
    target = exact.float().to(ours.dtype)
    return {side: round((t == target).float().mean().item(), 4) for side, t in (("ref", ours), ("baseline", theirs))}


def _rms64(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = h.double()
    return h * (h.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w.double()


def _layers_for(dtype: torch.dtype, repeats: int) -> list[dict]:
    c = torch.ops._C
    rows = []
    x = torch.randn(64, 4096).to(dtype)
    w = torch.randn(4096).to(dtype)
    res = torch.randn(64, 4096).to(dtype)
    out = torch.empty_like(x)
    t = best_ms({"ref": lambda: ops.rms_norm(x, w, 1e-6), "base": lambda: c.rms_norm(out, x, w, 1e-6)}, repeats)
    rows.append(entry("rms_norm [64,4096]", dtype, t, "vllm torch.ops._C.rms_norm"))
    if dtype == torch.bfloat16:
        c.rms_norm(out, x, w, 1e-6)
        rows[-1]["correctly_rounded"] = _correctly_rounded(ops.rms_norm(x, w, 1e-6), out, _rms64(x, w))

    def fused_base():
        xx, rr = x.clone(), res.clone()  # the vLLM op works in place
        c.fused_add_rms_norm(xx, rr, w, 1e-6)

    def fused_ref():
        x.clone(), res.clone()  # the same copies, for a fair comparison
        ops.rms_norm(x, w, 1e-6, res)

    t = best_ms({"ref": fused_ref, "base": fused_base}, repeats)
    rows.append(entry("rms_norm+residual [64,4096]", dtype, t, "vllm torch.ops._C.fused_add_rms_norm"))
    g = torch.randn(64, 2 * 14336).to(dtype)
    gout = torch.empty(64, 14336, dtype=dtype)
    t = best_ms({"ref": lambda: ops.silu_and_mul(g), "base": lambda: c.silu_and_mul(gout, g)}, repeats)
    rows.append(entry("silu_and_mul [64,28672]", dtype, t, "vllm torch.ops._C.silu_and_mul"))
    positions = torch.randint(0, 4096, (64,))
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    ang = torch.arange(4096).float()[:, None] * inv
    cache = torch.cat([ang.cos(), ang.sin()], -1).to(dtype)
    # q and k as an attention layer passes them: views of its fused QKV projection's output
    q, k, _ = torch.randn(64, (HQ + 2 * HKV) * D).to(dtype).split([HQ * D, HKV * D, HKV * D], dim=-1)
    t = best_ms(
        {
            "ref": lambda: ops.rotary_embedding(positions, q, k, cache, head_size=D, rotary_dim=D, is_neox=True),
            "base": lambda: c.rotary_embedding(positions, q, k, D, cache, True),
        },
        repeats,
    )
    rows.append(entry("rotary_embedding [64 tok]", dtype, t, "vllm torch.ops._C.rotary_embedding"))
    if dtype == torch.bfloat16:
        q0 = q.clone()
        q_ref, k_ref, q_base, k_base = q0.clone(), k.clone(), q0.clone(), k.clone()
        ops.rotary_embedding(positions, q_ref, k_ref, cache, head_size=D, rotary_dim=D, is_neox=True)
        c.rotary_embedding(positions, q_base, k_base, D, cache, True)
        cs = cache.double()[positions][:, None]
        heads = q0.double().view(64, HQ, D)
        a, b = heads[..., : D // 2], heads[..., D // 2 :]
        cos, sin = cs[..., : D // 2], cs[..., D // 2 :]
        exact = torch.cat([a * cos - b * sin, b * cos + a * sin], -1).view(64, HQ * D)
        rows[-1]["correctly_rounded"] = _correctly_rounded(q_ref, q_base, exact)
    return rows


def bench_mla(repeats: int) -> list[dict]:
    rank, rope_dim, heads, ctx, b = 512, 64, 16, 1024, 8
    bs = 16  # the only block size vLLM's CPU MLA kernel takes
    nb = b * ctx // bs + 2
    cache = torch.randn(nb, bs, rank + rope_dim)
    table = torch.randperm(nb)[: b * ctx // bs].view(b, -1).int()
    seq = torch.full((b,), ctx, dtype=torch.int32)
    q = torch.randn(b, heads, rank + rope_dim)
    latent, rope = cache[..., :rank].unsqueeze(2), cache[..., rank:].unsqueeze(2)
    out = torch.zeros(b, heads, rank)
    q_nope, q_rope = q[..., :rank].contiguous(), q[..., rank:].contiguous()

    def ours():
        return ops.mla_decode_attention(q_nope, q_rope, latent, rope, table, seq, scale=0.05)

    def base():
        out.zero_()
        torch.ops._C.mla_decode_kvcache(out, q, cache, 0.05, table, seq)
        return out

    torch.testing.assert_close(ours(), base(), rtol=2e-3, atol=2e-3)
    t = best_ms({"ref": ours, "base": base}, repeats)
    return [entry("mla_decode_attention (8x1024)", torch.float32, t, "vllm torch.ops._C.mla_decode_kvcache")]


def bench_sampling(repeats: int) -> list[dict]:
    """Gumbel-max sampling of 4 rows at temperature 0.8 (Model Runner V2's sampler: counter-based noise of seed,
    position and token) against what plain vLLM CPU samples such rows with: its sampler's temperature division,
    then `fused_gumbel_argmax` (SplitMix64 noise per token)."""
    rows = []
    temp, seeds, positions = torch.full((4,), 0.8), torch.arange(4) + 123, torch.arange(4) + 50
    for vocab in (32_000, 151_936):
        logits = torch.randn(4, vocab)
        t = best_ms({"ref": lambda logits=logits: ops.gumbel_sample(logits, temp, seeds, positions),
                     "base": lambda logits=logits: torch.ops._C.fused_gumbel_argmax(logits / temp[:, None], seeds)},
                    repeats)
        rows.append(entry(f"gumbel_sample 4x{vocab}", torch.float32, t, "vllm torch.ops._C.fused_gumbel_argmax"))
    return rows


def bench_plain_torch(repeats: int) -> list[dict]:
    """Ops without a vLLM CPU kernel, against the plain torch formulation a user would write (or vLLM's own torch
    formulation, where it has one)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    gen = torch.Generator().manual_seed(0)
    rows = []
    gating = torch.randn(256, 64)

    def topk_base():
        w, i = torch.softmax(gating, -1).topk(8, dim=-1)
        return w / w.sum(-1, keepdim=True), i

    # The routing and experts the platform's MoE layers call (softmax top-k, renormalised: Qwen3-MoE's routing).
    t = best_ms({"ref": lambda: ops.moe_gating_topk(gating, 8), "base": topk_base}, repeats)
    rows.append(entry("moe_gating_topk softmax [256,64] k=8", torch.float32, t, "torch softmax+topk"))

    tokens, hidden, inter, experts, k = 64, 1024, 512, 16, 2
    x = torch.randn(tokens, hidden)
    w13, w2 = torch.randn(experts, 2 * inter, hidden) / 32, torch.randn(experts, hidden, inter) / 32
    weights, ids = ops.moe_gating_topk(torch.randn(tokens, experts), k)

    def moe_base():  # every token through its experts, one token at a time
        out = torch.zeros(tokens, hidden)
        for t_ in range(tokens):
            for j in range(k):
                e = int(ids[t_, j])
                gu = w13[e] @ x[t_]
                out[t_] += weights[t_, j] * (w2[e] @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:]))
        return out

    t = best_ms({"ref": lambda: ops.fused_moe(x, w13, w2, weights, ids), "base": moe_base}, max(3, repeats // 4))
    rows.append(entry("fused_moe 64tok E16", torch.float32, t, "torch per-token expert loop"))

    logits = torch.randn(64, 32000)
    top_k, top_p = torch.full((64,), 50), torch.full((64,), 0.9)
    t = best_ms({"ref": lambda: ops.sample_greedy(logits), "base": lambda: logits.argmax(-1)}, repeats)
    rows.append(entry("sample_greedy [64,32000]", torch.float32, t, "torch argmax"))

    def filter_base():  # vLLM's own torch filter, as its samplers run it without Triton
        return apply_top_k_top_p_pytorch(logits.clone(), top_k, top_p)

    t = best_ms({"ref": lambda: ops.top_k_top_p(logits, top_k, top_p), "base": filter_base}, repeats)
    rows.append(entry("top_k_top_p filter [64,32000]", torch.float32, t, "vLLM apply_top_k_top_p_pytorch"))

    b, kk, vocab = 16, 4, 32000
    target = torch.randn(b, kk, vocab)
    drafts = torch.randint(0, vocab, (b, kk))
    draft_probs = torch.softmax(torch.randn(b, kk, vocab), -1)
    bonus = torch.randint(0, vocab, (b,))
    temps = torch.ones(b)

    def rejection_base():  # the textbook per-request, per-position loop
        p = torch.softmax(target, -1)
        out = []
        for r in range(b):
            row = []
            for j in range(kk):
                x_ = int(drafts[r, j])
                if torch.rand((), generator=gen) * draft_probs[r, j, x_] < p[r, j, x_]:
                    row.append(x_)
                    continue
                resid = (p[r, j] - draft_probs[r, j]).clamp(min=0)
                row.append(int(torch.multinomial(resid / resid.sum(), 1, generator=gen)))
                break
            else:
                row.append(int(bonus[r]))
            out.append(row)
        return out

    t = best_ms(
        {
            "ref": lambda: ops.rejection_sample(drafts, draft_probs, target, bonus, temperature=temps, generator=gen),
            "base": rejection_base,
        },
        repeats,
    )
    rows.append(entry("rejection_sample 16x4 V32000", torch.float32, t, "torch per-request loop"))
    return rows


def validation_overhead(repeats: int) -> dict:
    """Validator cost of a 1-token decode step (one layer's kernel ops) over that step's time without validation."""
    case = PagedCase(torch.float32, [1], [CTX], seed=3)
    hidden = HQ * D
    x, res, w = torch.randn(1, hidden), torch.randn(1, hidden), torch.randn(hidden)
    qkv = torch.randn(1, (HQ + 2 * HKV) * D)
    q, k = qkv[:, : HQ * D], qkv[:, HQ * D : (HQ + HKV) * D]
    new_k, new_v = torch.randn(1, HKV, D), torch.randn(1, HKV, D)
    slot = case.slots[-1:]
    positions = torch.tensor([CTX - 1])
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    ang = torch.arange(CTX).float()[:, None] * inv
    cos_sin = torch.cat([ang.cos(), ang.sin()], -1)
    gate_up = torch.randn(1, 2 * 14336)
    query = case.query

    def step():
        ops.rms_norm(x, w, 1e-6, res)
        ops.rotary_embedding(positions, q, k, cos_sin, head_size=D, rotary_dim=D, is_neox=True)
        ops.reshape_and_cache(new_k, new_v, case.k, case.v, slot)
        ops.paged_attention(query, case.k, case.v, case.block_table, case.qsl, case.seq_lens, scale=case.scale)
        ops.rms_norm(x, w, 1e-6, res)
        ops.silu_and_mul(gate_up)

    def validators():
        checks.check_rms_norm(x, w, 1e-6, res)
        checks.check_rotary_embedding(positions, q, k, cos_sin, D, D)
        checks.check_reshape_and_cache(new_k, new_v, case.k, case.v, slot)
        checks.check_paged_attention(
            query, case.k, case.v, case.block_table, case.qsl, case.seq_lens, case.scale, None, None, None
        )
        checks.check_rms_norm(x, w, 1e-6, res)
        checks.check_silu_and_mul(gate_up)

    def validators_x100():
        for _ in range(100):
            validators()

    # `set_validation` rebinds every op (~6 ms), so it is switched per block of rounds, not per call (toggling it
    # around each call put two rebinds into every "on" step: 12.8 ms against 0.7)
    t = {}
    for half in range(2):
        for side in ("off", "on") if half == 0 else ("on", "off"):
            ascend_kernels.set_validation(side == "on")
            try:
                ms = best_ms({side: step}, max(1, repeats // 2))[side]
            finally:
                ascend_kernels.set_validation(False)
            t[side] = min(t.get(side, ms), ms)
    t.update(best_ms({"checks_x100": validators_x100}, repeats))
    per_step_checks = t["checks_x100"] / 100
    result = {
        "checks_us_per_step": round(per_step_checks * 1e3, 2),
        "step_ms_validation_off": round(t["off"], 4),
        "step_ms_validation_on": round(t["on"], 4),
        "fraction_direct": round(per_step_checks / t["off"], 4),
        "fraction_paired": round((t["on"] - t["off"]) / t["off"], 4),
        "definition": "validator time of one layer's kernel ops for 1 request at a 1024-token context / "
        "that step's time with validation off (fraction_direct); fraction_paired is on-vs-off timing (noisier)",
    }
    log(f"validation: {result}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch/OpenMP threads for both sides (0: torch's default)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ascend_kernels.set_backend("reference")
    ascend_kernels.set_validation(False)  # as an engine runs the ops; validation_overhead times the checks
    torch.manual_seed(0)
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads, backend {ascend_kernels.get_backend()}")
    rows, decode = bench_paged(args.repeats)
    mla_rows = bench_mla(args.repeats)
    rows += mla_rows
    rows += bench_layers(args.repeats)
    rows += bench_sampling(args.repeats)
    rows += bench_plain_torch(args.repeats)
    validation = validation_overhead(args.repeats * 5)
    from ascend_kernels.reference import native_build

    native = native_build.status()
    result = {
        "reference_native": {"available": native.available, "reason": native.reason},
        "ops": rows,
        "paged_decode_ratio": max(decode.values()),
        "paged_decode_ratio_by_dtype": decode,
        "mla_decode_ratio": mla_rows[0]["ratio"],
        "validation_overhead": validation["fraction_direct"],
        "validation": validation,
        "goals": {
            "paged_decode_ratio": 1.5,
            "paged_attention_mixed (512+2)": 2.0,
            "rms_norm [64,4096]": 1.5,
            "rms_norm+residual [64,4096]": 1.5,
            "rotary_embedding [64 tok]": 1.5,
            "rejection_sample 16x4 V32000": 2.0,
            "mla_decode_ratio": 2.0,
            "validation_overhead": 0.05,
        },
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
