"""DeepSeek V4.1's attention in float64 over a whole sequence, for the V4.1 reference (`deepseek_v41_reference`).

Written from vLLM 0.32's sources as the spec (paths relative to vllm/models/deepseek_v41/ unless absolute):

- projections (attention.py:359-404, 954-1080): qr = q_norm(wq_a x); q = wq_b qr per head, no per-head q norm
  (the fused kernel runs with apply_q_norm False, attention.py:1082); kv = kv_norm(wkv x) is both key and value;
- RoPE (common/rope.py:9-53): GPT-J (interleaved pairs) on the last 64 of the 512 dims, theta `rope_theta` on
  ratio-0 layers and `compress_rope_theta` on ratio-1/2 layers (q, window keys, compressed rows and output alike),
  plain (rope_type default: no YaRN);
- compressor (compressor.py:196-247, common/ops/fused_compress_quant_cache.py:22-226): kv_score = x [wkv; wgate]^T;
  ratio 1: entry i = norm(kv_i); ratio 2: entry i pools rows 2i, 2i+1 with a per-dim softmax of their scores, then
  the RMSNorm; the latent is bfloat16 (`latent_out`); cache rows are rotated at the group's first position
  i * ratio (:344); entry i is visible to a query at t once closed, i < (t + 1) // ratio;
- index keys (attention.py:1434-1467, common/ops/indexer_k_store.py:123-250): k = k_norm(wk latent) rounded to
  bf16, rotated (last 64 of 128 dims) at i * ratio, rounded to bf16, fp8 with one power-of-two scale per row;
- indexer (attention.py:1469-1511, deepseek_v4/common/ops/fused_indexer_q.py:115-200,
  vllm/model_executor/layers/sparse_attn_indexer.py:650-712): q = indexer.wq_b qr, rotated at t, its rotated dims
  rounded to bf16, fp8 with a power-of-two scale per (token, head); weights = weights_proj x * 128^-0.5 *
  n_heads^-0.5; logit[t, s] = sum_h weights[t, h] relu(q[t, h] . k[s]); the top index_topk causal entries;
- candidate blocks (vllm/model_executor/kernels/attention/dsa/candidate_blocks.py:149-230): the candidate source's
  logits split into blocks of candidate_block_size entries, block score = max logit, the newest block +inf, top
  candidate_topk_blocks blocks kept; later index sources set logits outside those blocks to -inf before their top-k;
- short-context shortcut (attention.py:1478-1505): vLLM selects every causal entry (no scoring, no candidates)
  when the BATCH's max seq len // ratio <= index_topk. Here each row selects every causal entry when its own count
  (t + 1) // ratio <= index_topk: the same selection for a one-prompt batch, and for any batch as long as
  (candidate_topk_blocks - 1) * candidate_block_size >= index_topk (a row with at most index_topk entries then keeps
  all its blocks, and the row top-k of <= index_topk finite scores takes them all);
- sparse attention (sparse_mla.py, flashmla.py forward_mqa; V4's math): softmax over the window keys (positions
  t - window + 1 .. t) and the selected compressed rows, scale 512^-0.5, with the per-head attention sink in the
  denominator; value = key row;
- output (nvidia/ops/o_proj.py:63-95): inverse RoPE at t on each head's last 64 dims, wo_a per group of heads,
  then wo_b.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROPE_DIM = 64
FP8_MAX = 448.0


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    import torch

    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def bf16(x: Any) -> Any:
    import torch

    return x.to(torch.bfloat16).to(x.dtype)


def fp8_pow2(x: Any, floor: float = 1e-4) -> Any:
    """x quantized to e4m3 with one power-of-two scale over its last dim (the indexer's fp8 rows)."""
    import torch

    scale = torch.exp2(torch.ceil(torch.log2(x.abs().amax(-1, keepdim=True).clamp(min=floor) / FP8_MAX)))
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype) * scale


def rope_angles(positions: Any, theta: float) -> tuple[Any, Any]:
    """cos, sin [len(positions), 32] of DeepSeek's GPT-J RoPE over 64 dims."""
    import torch

    inv_freq = 1.0 / theta ** (torch.arange(0, ROPE_DIM, 2, dtype=torch.float64) / ROPE_DIM)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def rotate(x: Any, cos: Any, sin: Any, inverse: bool = False) -> Any:
    """Rotate interleaved pairs of the last 64 dims of x [T, ..., D]; cos/sin [T, 32]."""
    import torch

    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if inverse:
        sin = -sin
    nope, rot = x[..., :-ROPE_DIM], x[..., -ROPE_DIM:]
    even, odd = rot[..., 0::2], rot[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat((nope, rotated), dim=-1)


@dataclass
class Rounding:
    """Where the reference rounds as vLLM's V4.1 math does on every path (defaults), or not."""

    latent_bf16: bool = True
    """The compressor latent is bfloat16 (fused_save_compress_norm's `latent_out`)."""
    index_fp8: bool = True
    """Index keys and queries as vLLM's fp8 indexer scores them (bf16 roundings, then fp8 with pow2 scales)."""


@dataclass
class KVSource:
    """What a KV-source layer publishes: the compressed rows (rotated) and, when it indexes, its index keys."""

    ratio: int
    rows: Any
    index_keys: Any | None = None


@dataclass
class SharedState:
    """Cross-layer state of one forward: the latest KV source, index selection and candidate blocks."""

    kv_sources: dict[int, KVSource] = field(default_factory=dict)
    selection: dict[int, Any] = field(default_factory=dict)
    """index source layer -> bool [T, entries] of the compressed entries each query attends."""
    candidates: Any | None = None
    """bool [T, entries]: entries inside each query's candidate blocks."""


def compress(x: Any, w: dict, prefix: str, ratio: int, eps: float, rounding: Rounding) -> Any:
    """The pre-RoPE latent of each closed group [T // ratio, 512]."""
    kv = x @ w[prefix + "compressor.wkv.weight"].T
    score = x @ w[prefix + "compressor.wgate.weight"].T if ratio == 2 else None
    return pool_and_norm(kv, score, ratio, w[prefix + "compressor.norm.weight"], eps, rounding)


def pool_and_norm(kv: Any, score: Any | None, ratio: int, norm_weight: Any, eps: float, rounding: Rounding) -> Any:
    """Ratio 1: each row; ratio 2: rows 2i, 2i+1 pooled by a per-dim softmax of their scores; then the RMSNorm."""
    import torch

    if ratio == 2:
        n = kv.shape[0] // 2
        kv, score = kv[: 2 * n].view(n, 2, -1), score[: 2 * n].view(n, 2, -1)
        kv = (kv * torch.softmax(score, dim=1)).sum(1)
    latent = rms_norm(kv, norm_weight, eps)
    return bf16(latent) if rounding.latent_bf16 else latent


def index_keys(latent: Any, w: dict, prefix: str, ratio: int, theta: float, eps: float, rounding: Rounding) -> Any:
    return keys_from_projection(latent @ w[prefix + "indexer.wk.weight"].T, w[prefix + "indexer.k_norm.weight"],
                                ratio, theta, eps, rounding)


def keys_from_projection(k_pre: Any, k_norm_weight: Any, ratio: int, theta: float, eps: float,
                         rounding: Rounding) -> Any:
    """Index keys [entries, 128] from wk(latent): k_norm, RoPE at each group's first position, as the fp8 indexer
    stores them (vLLM also rounds wk's output to bf16, but only because its model dtype is bf16)."""
    import torch

    k = rms_norm(k_pre, k_norm_weight, eps)
    cos, sin = rope_angles(torch.arange(k.shape[0]) * ratio, theta)
    if rounding.index_fp8:
        return fp8_pow2(bf16(rotate(bf16(k), cos, sin)))
    return rotate(k, cos, sin)


def index_queries(q: Any, positions: Any, theta: float, rounding: Rounding) -> Any:
    """Indexer queries [T, heads, 128] rotated at their positions, as the fp8 indexer scores them."""
    import torch

    q = rotate(q, *rope_angles(positions, theta))
    if rounding.index_fp8:
        q = fp8_pow2(torch.cat((q[..., :-ROPE_DIM], bf16(q[..., -ROPE_DIM:])), dim=-1))
    return q


def index_logits(x: Any, qr: Any, keys: Any, w: dict, prefix: str, n_heads: int, ratio: int, theta: float,
                 rounding: Rounding) -> Any:
    """[T, entries] indexer scores, -inf on entries not yet closed at the query."""
    import torch

    t = x.shape[0]
    q = index_queries((qr @ w[prefix + "indexer.wq_b.weight"].T).view(t, n_heads, -1), torch.arange(t), theta,
                      rounding)
    weights = (x @ w[prefix + "indexer.weights_proj.weight"].T) * q.shape[-1] ** -0.5 * n_heads**-0.5
    logits = (torch.relu(torch.einsum("thd,sd->ths", q, keys)) * weights.unsqueeze(-1)).sum(1)
    return logits.masked_fill(~causal_entries(t, keys.shape[0], ratio), float("-inf"))


def causal_entries(t: int, entries: int, ratio: int) -> Any:
    """bool [t, entries]: entry i is closed at query position p when i < (p + 1) // ratio."""
    import torch

    return torch.arange(entries)[None, :] < ((torch.arange(t) + 1) // ratio)[:, None]


def candidate_mask(logits: Any, block_size: int, topk_blocks: int) -> Any:
    """bool [T, entries]: entries inside each row's kept candidate blocks (the newest block always kept)."""
    import torch

    t, entries = logits.shape
    n_blocks = -(-entries // block_size)
    padded = torch.full((t, n_blocks * block_size), float("-inf"), dtype=logits.dtype)
    padded[:, :entries] = logits
    scores = padded.view(t, n_blocks, block_size).amax(-1)
    counts = torch.isfinite(logits).sum(-1)
    newest = (counts - 1).clamp(min=0) // block_size
    rows = counts > 0
    scores[rows, newest[rows]] = float("inf")
    top = scores.topk(min(topk_blocks, n_blocks), dim=-1)
    kept = torch.zeros(t, n_blocks, dtype=torch.bool)
    kept.scatter_(1, top.indices, top.values != float("-inf"))
    closed = torch.arange(entries)[None, :] < counts[:, None]
    return kept.repeat_interleave(block_size, dim=1)[:, :entries] & closed


def select(logits: Any, causal: Any, topk: int) -> Any:
    """bool [T, entries]: every causal entry of rows with at most topk of them, else the topk best finite ones."""
    import torch

    counts = causal.sum(-1, keepdim=True)
    k = min(topk, logits.shape[1])
    chosen = torch.zeros_like(causal)
    if k:
        # Equal logits (relu zeros make exact ties common) go to the lower position first, as the engine's top-k
        # (ascend_kernels.dsv4_topk_transform) does; torch.topk leaves the order among equals unspecified.
        order = torch.argsort(-logits, dim=-1, stable=True)[:, :k]
        chosen.scatter_(1, order, torch.isfinite(logits.gather(1, order)))
    return torch.where(counts <= topk, causal, chosen)


@dataclass
class LayerTopology:
    layer: int
    ratio: int
    is_kv_source: bool
    is_index_source: bool
    kv_source: int | None
    index_source: int | None
    is_candidate_source: bool
    uses_candidates: bool


def topology(config: dict, layer: int) -> LayerTopology:
    ratios = config["compress_ratios"]
    ratio = int(ratios[layer]) if layer < len(ratios) else 0
    kv_sources = config.get("kv_source_layer_ids") or []
    index_sources = config.get("index_source_layer_ids") or []
    candidate = config.get("candidate_source_layer_id", -1)
    candidate = candidate if candidate is not None and config.get("candidate_topk_blocks", 0) > 0 else -1
    is_index = layer in index_sources
    return LayerTopology(
        layer=layer, ratio=ratio, is_kv_source=layer in kv_sources, is_index_source=is_index,
        kv_source=max(s for s in kv_sources if s <= layer) if ratio else None,
        index_source=max(s for s in index_sources if s <= layer) if ratio else None,
        is_candidate_source=is_index and layer == candidate, uses_candidates=is_index and 0 <= candidate < layer)


def attention(x: Any, w: dict, config: dict, topo: LayerTopology, state: SharedState, rounding: Rounding, *,
              index_topk: int, candidates: bool) -> Any:
    """One V4.1 attention sublayer over the whole sequence: x [T, hidden] (normed input) -> [T, hidden]."""
    import torch

    p = f"layers.{topo.layer}.attn."
    eps = config["rms_norm_eps"]
    t = x.shape[0]
    n_heads, head_dim = config["num_attention_heads"], config["head_dim"]
    theta = config["compress_rope_theta"] if topo.ratio else config["rope_theta"]
    cos, sin = rope_angles(torch.arange(t), theta)

    qr = rms_norm(x @ w[p + "wq_a.weight"].T, w[p + "q_norm.weight"], eps)
    q = rotate((qr @ w[p + "wq_b.weight"].T).view(t, n_heads, head_dim), cos, sin)
    kv = rotate(rms_norm(x @ w[p + "wkv.weight"].T, w[p + "kv_norm.weight"], eps), cos, sin)

    window = config["sliding_window"]
    pos = torch.arange(t)
    keys, visible = [kv], [(pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)]
    if topo.ratio:
        if topo.is_kv_source:
            latent = compress(x, w, p, topo.ratio, eps, rounding)
            g_cos, g_sin = rope_angles(torch.arange(latent.shape[0]) * topo.ratio, theta)
            source = KVSource(topo.ratio, rotate(latent, g_cos, g_sin))
            if topo.is_index_source:
                source.index_keys = index_keys(latent, w, p, topo.ratio, theta, eps, rounding)
            state.kv_sources[topo.layer] = source
        source = state.kv_sources[topo.kv_source]
        if topo.is_index_source:
            keys_of = source.index_keys  # an index source that is no KV source reads its KV source's keys
            causal = causal_entries(t, keys_of.shape[0], topo.ratio)
            logits = index_logits(x, qr, keys_of, w, p, config["index_n_heads"], topo.ratio, theta, rounding)
            if candidates and topo.is_candidate_source:
                state.candidates = candidate_mask(logits, config["candidate_block_size"],
                                                  config["candidate_topk_blocks"])
            elif candidates and topo.uses_candidates and state.candidates is not None:
                logits = logits.masked_fill(~state.candidates, float("-inf"))
            state.selection[topo.layer] = select(logits, causal, index_topk)
        keys.append(source.rows)
        visible.append(state.selection[topo.index_source])

    keys_all = torch.cat(keys, dim=0)
    mask = torch.cat(visible, dim=1)
    scores = torch.einsum("thd,sd->ths", q, keys_all) * head_dim**-0.5
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    sink = w[p + "attn_sink"].view(1, n_heads, 1).expand(t, n_heads, 1)
    probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    out = rotate(torch.einsum("ths,sd->thd", probs, keys_all), cos, sin, inverse=True)

    groups = config["o_groups"]
    wo_a = w[p + "wo_a.weight"].view(groups, config["o_lora_rank"], -1)
    z = torch.einsum("tgi,gri->tgr", out.reshape(t, groups, -1), wo_a).flatten(1)
    return z @ w[p + "wo_b.weight"].T
