"""DeepSeek V4.1's engram in float64, for the V4.1 reference (`deepseek_v41_reference`).

Written from vLLM 0.32's vllm/models/deepseek_v41/common/engram.py as the spec (paths below relative to that file):

- token map (`build_compressed_token_map`, :135-183): each token id decoded alone, normalized (NFKC, NFD, accents
  stripped, lowercased, runs of space/tab/newline collapsed to one space, a lone space kept, stripped); tokens
  normalizing alike share a compressed id, numbered in first-seen order;
- multipliers (`compute_hash_multipliers`, :186-205): per engram layer, `np.random.default_rng(10007 * layer_id)`
  draws `max_ngram` int64 values below (int64 max // compressed vocab) // 2, made odd (`2 v + 1`);
- bucket layout (`EngramLayout`, :208-250): per layer and n-gram size, `n_heads` distinct primes counted up from
  engram_vocab_size - 1 (never reused, across layers too); each (n-gram, head) bucket range starts where the
  previous one ends in that layer's table;
- hash (`_hash_ids_kernel`, :288-420, on a full sequence: every lookback is in the batch): for shift s = 0 ..
  max_ngram - 1, value = compressed id of the token s back, or the pad token's compressed id once a lookback falls
  before position 0 (and for every longer shift after it); `rolling ^= value * mult[layer, s]`; for s >= 1 head h's
  row is `rolling % prime + offset` (the (s+1)-gram);
- lookup (`ParallelEngramEmbedding`, :942-1184): fp8 e4m3 row times its UE8M0 scale per 32 columns (exact in
  bf16, what vLLM gathers into);
- gate (`_fused_engram_post_wkv_kernel`, :1186-1275): kv = wkv(rows flattened) = [hc keys | one value] each
  `hidden` wide; per stream j, dot = <h_j * q_w[j] * k_w[j], key_j> * rsqrt(mean h_j^2 + eps) *
  rsqrt(mean key_j^2 + eps) / sqrt(hidden); gate = sigmoid(sign(dot) sqrt(max(|dot|, 1e-6))); h_j += gate * value.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

CLAMP = 1e-6


def _normalize(text: str) -> str:
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    text = "".join(c for c in text if unicodedata.category(c) != "Mn").lower()
    text = re.sub(r"[ \t\r\n]+", " ", text)
    return text if text == " " else text.strip()


def compressed_token_map(tokenizer) -> tuple[list[int], int]:
    """token id -> compressed id, and the number of compressed ids."""
    backend = tokenizer.backend_tokenizer
    keys: dict[str, int] = {}
    lookup = []
    for token_id in range(len(tokenizer)):
        text = backend.decode([token_id], skip_special_tokens=False)
        # a partial UTF-8 byte token has nothing to normalize: keyed by its raw form
        key = backend.id_to_token(token_id) if "\ufffd" in text else _normalize(text) or text
        lookup.append(keys.setdefault(key, len(keys)))
    return lookup, len(keys)


def hash_multipliers(layer_ids, max_ngram: int, compressed_vocab: int) -> list[list[int]]:
    import numpy as np

    bound = max(1, ((2**63 - 1) // compressed_vocab) // 2)
    return [[int(v) * 2 + 1 for v in np.random.default_rng(10007 * layer).integers(0, bound, size=(max_ngram,),
                                                                                      dtype=np.int64)]
            for layer in layer_ids]


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def bucket_primes(n_layers: int, max_ngram: int, n_heads: int, engram_vocab_size: int) -> list[list[list[int]]]:
    seen: set[int] = set()
    layers = []
    for _ in range(n_layers):
        per_ngram = []
        for _ in range(max_ngram - 1):
            sizes, current = [], engram_vocab_size - 1
            for _ in range(n_heads):
                current += 1
                while not _is_prime(current) or current in seen:
                    current += 1
                seen.add(current)
                sizes.append(current)
            per_ngram.append(sizes)
        layers.append(per_ngram)
    return layers


def ngram_rows(compressed_ids: list[int], pad_id: int, mult: list[int], primes: list[list[int]]) -> list[list[int]]:
    """Table rows each position reads: [T][(max_ngram - 1) * n_heads], (n-gram, head) major like vLLM's columns."""
    flat = [p for per_ngram in primes for p in per_ngram]
    offsets = [sum(flat[:i]) for i in range(len(flat))]
    n_heads = len(primes[0])
    out = []
    for pos in range(len(compressed_ids)):
        rolling, blocked, row = 0, False, []
        for shift, m in enumerate(mult):
            back = pos - shift
            blocked |= back < 0
            rolling ^= (pad_id if blocked else compressed_ids[back]) * m
            if shift:
                for h in range(n_heads):
                    col = (shift - 1) * n_heads + h
                    row.append(rolling % flat[col] + offsets[col])
        out.append(row)
    return out


def dequantized_table(weight: Any, scale: Any) -> Any:
    """fp8 e4m3 rows times their UE8M0 scale per 32 columns, float64."""
    import torch

    values = weight.to(torch.float64).unflatten(-1, (-1, 32))
    return (values * scale.to(torch.float64).unsqueeze(-1)).flatten(-2)


def engram_kv(rows: Any, table: Any, wkv: Any) -> Any:
    """[T, (hc + 1) * hidden]: the looked-up rows (flattened per position) through `wkv`."""
    return table[rows].flatten(1) @ wkv.T


def engram_gate(residual: Any, kv: Any, q_weight: Any, k_weight: Any, eps: float) -> Any:
    """residual [T, hc, H] plus each stream's gated share of the value (the last H columns of kv)."""
    import torch

    t, hc, hidden = residual.shape
    keys, value = kv[:, : hc * hidden].view(t, hc, hidden), kv[:, hc * hidden:]

    def rms(x):
        return torch.rsqrt(x.square().mean(-1) + eps)

    dot = (residual * q_weight * k_weight * keys).sum(-1) * rms(residual) * rms(keys) / hidden**0.5
    magnitude = dot.abs().clamp(min=CLAMP).sqrt()
    gate = torch.sigmoid(torch.where(dot < 0, -magnitude, magnitude))
    return residual + gate.unsqueeze(-1) * value.unsqueeze(1)


def engram_inject(residual: Any, rows: Any, table: Any, wkv: Any, q_weight: Any, k_weight: Any, eps: float) -> Any:
    """residual [T, hc, H] float64 plus the gated n-gram value; rows [T, cols] table row ids."""
    return engram_gate(residual, engram_kv(rows, table, wkv), q_weight, k_weight, eps)
