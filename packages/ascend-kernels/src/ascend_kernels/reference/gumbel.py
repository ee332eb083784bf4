"""Gumbel-max sampling with counter-based noise (reference), the scheme of vLLM's Model Runner V2 sampler.

The noise for token j of a row is a pure function of (seed, position, j): murmur3-style 32-bit mixing of the three,
mapped to a uniform u, then Gumbel noise -log(-log1p(-u)) in float32 (-log(-log u) in float64). A request's draws
therefore do not depend on which other requests share its batch, and a seeded request repeats exactly. The 32-bit
arithmetic runs in int64 tensors masked to 32 bits; products are split in 16-bit halves so nothing overflows.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_TINY_LOG_ARG = 5.960464477539063e-08  # 2**-24, vLLM's floor for log(1 - u)


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    lo, hi = constant & 0xFFFF, constant >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _rotl32(x: torch.Tensor, shift: int) -> torch.Tensor:
    return ((x << shift) & _MASK32) | (x >> (32 - shift))


def _mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    key = _rotl32(_mul32(key, 0xCC9E2D51), 15)
    key = _mul32(key, 0x1B873593)
    h = _rotl32(h ^ key, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _MASK32


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def hash32(seed: torch.Tensor, pos: torch.Tensor, token: torch.Tensor, domain: int = 0) -> torch.Tensor:
    """[rows] seeds and positions, [vocab] token ids -> [rows, vocab] 32-bit hashes (as int64)."""
    seed, pos = seed.long()[:, None], pos.long()[:, None]
    h = torch.full_like(seed, domain)
    h = _mix(h, seed & _MASK32)
    h = _mix(h, (seed >> 32) & _MASK32)
    h = _mix(h, pos & _MASK32)
    h = _mix(h.expand(-1, token.shape[0]), token.long()[None, :] & _MASK32)
    return _fmix(h ^ 16)


def uniform32(seed, pos, token) -> torch.Tensor:
    r = hash32(seed, pos, token)
    hi, lo = (r >> 16).float(), (r & 0xFFFF).float()
    return hi * 1.52587890625e-05 + (lo + 0.5) * 2.3283064365386963e-10


def uniform64(seed, pos, token) -> torch.Tensor:
    lo, hi = hash32(seed, pos, token), hash32(seed, pos, token, domain=0x9E3779B9)
    random53 = (hi << 21) | (lo >> 11)  # ((hi << 32) | lo) >> 11 without leaving int64's positive range
    u = (random53.double() + 0.5) * 1.1102230246251565e-16
    return torch.where(u == 1.0, u - 1.1102230246251565e-16, u)


def _log1m(u: torch.Tensor) -> torch.Tensor:
    """log(1 - u) in float32 as vLLM computes it: a degree-8 series below 0.25, a clamped log above."""
    poly = torch.full_like(u, 1.0 / 8.0)
    for c in (1.0 / 7.0, 1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 1.0 / 2.0, 1.0):
        poly = c + u * poly
    series = -u * poly
    direct = torch.log(torch.clamp(1.0 - u, min=_TINY_LOG_ARG))
    return torch.where(u < 0.25, series, direct)


def gumbel_noise(seeds, positions, vocab_size: int, *, fp64: bool = False) -> torch.Tensor:
    token = torch.arange(vocab_size, device=seeds.device)
    if fp64:
        return -torch.log(-torch.log(uniform64(seeds, positions, token)))
    return -torch.log(-_log1m(uniform32(seeds, positions, token)))


def gumbel_sample(logits, temperature, seeds, positions, *, apply_temperature=True, fp64=False):
    rows, vocab = logits.shape
    if rows == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    scores = logits.float()
    temp = temperature.float()
    random_rows = temp != 0.0
    if not bool(random_rows.any()):
        return scores.argmax(dim=-1)
    idx = random_rows.nonzero().view(-1)
    noisy = scores[idx]
    if apply_temperature:
        noisy = noisy / temp[idx, None]
    if fp64:
        noisy = noisy.double()
    noisy = noisy + gumbel_noise(seeds[idx], positions[idx], vocab, fp64=fp64)
    sampled = scores.argmax(dim=-1)
    sampled[idx] = noisy.argmax(dim=-1)
    return sampled
