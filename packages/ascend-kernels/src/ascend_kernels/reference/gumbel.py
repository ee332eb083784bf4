"""Gumbel-max sampling with counter-based noise (reference), the scheme of vLLM's Model Runner V2 sampler.

The noise for token j of a row is a pure function of (seed, position, j): murmur3-style 32-bit mixing of the three,
mapped to a uniform u, then Gumbel noise -log(-log1p(-u)) in float32 (-log(-log u) in float64). A request's draws
therefore do not depend on which other requests share its batch, and a seeded request repeats exactly. The 32-bit
arithmetic runs in int64 tensors masked to 32 bits; products go through uint32 (whose multiplication wraps, as the
hash wants). Only the token's own mixing and the finaliser touch `[rows, vocab]`: the seed and position are mixed per
row (Python ints), and each token id's key scrambling is computed once per vocabulary size. With float32 noise on
the host, one native loop computes the noise per token in registers (`native_gumbel`): the same operations, except
that its two logarithms may differ from torch's in the last bit.
"""

from __future__ import annotations

import functools

import torch

from ascend_kernels.reference import native_gumbel

_MASK32 = 0xFFFFFFFF
_TINY_LOG_ARG = 5.960464477539063e-08  # 2**-24, vLLM's floor for log(1 - u)


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32)."""
    return (x.to(torch.uint32) * constant).to(torch.int64)


def _rotl32(x: torch.Tensor, shift: int) -> torch.Tensor:
    return ((x << shift) & _MASK32) | (x >> (32 - shift))


def _scramble(key: torch.Tensor) -> torch.Tensor:
    return _mul32(_rotl32(_mul32(key, 0xCC9E2D51), 15), 0x1B873593)


def _mix_scrambled(h: torch.Tensor, scrambled: torch.Tensor) -> torch.Tensor:
    h = _rotl32(h ^ scrambled, 13)
    return (h * 5 + 0xE6546B64) & _MASK32  # h * 5 < 2**35: no wrap needed before the mask


@functools.lru_cache(maxsize=8)
def _token_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    return _scramble(torch.arange(vocab_size, device=device))


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _py_mix(h: int, key: int) -> int:
    key = (key * 0xCC9E2D51) & _MASK32
    key = ((key << 15) | (key >> 17)) & _MASK32
    key = (key * 0x1B873593) & _MASK32
    h ^= key
    h = ((h << 13) | (h >> 19)) & _MASK32
    return (h * 5 + 0xE6546B64) & _MASK32


def _row_state(seed: torch.Tensor, pos: torch.Tensor, domain: int) -> torch.Tensor:
    """The hash state after mixing each row's seed and position: `[rows, 1]`, computed with Python ints (a few
    rows; as tensor ops it would be dozens of launches on one-element columns)."""
    states = []
    for s, p in zip(seed.tolist(), pos.tolist(), strict=True):
        h = _py_mix(domain, s & _MASK32)
        h = _py_mix(h, (s >> 32) & _MASK32)
        states.append(_py_mix(h, p & _MASK32))
    return torch.tensor(states, dtype=torch.int64, device=seed.device).view(-1, 1)


def _hash_scrambled(seed, pos, scrambled_tokens: torch.Tensor, domain: int = 0) -> torch.Tensor:
    return _fmix(_mix_scrambled(_row_state(seed, pos, domain), scrambled_tokens[None, :]) ^ 16)


def hash32(seed: torch.Tensor, pos: torch.Tensor, token: torch.Tensor, domain: int = 0) -> torch.Tensor:
    """[rows] seeds and positions, [vocab] token ids -> [rows, vocab] 32-bit hashes (as int64)."""
    return _hash_scrambled(seed, pos, _scramble(token.long() & _MASK32), domain)


def uniform32(seed, pos, vocab_size: int) -> torch.Tensor:
    r = _hash_scrambled(seed, pos, _token_keys(vocab_size, seed.device))
    hi, lo = (r >> 16).float(), (r & 0xFFFF).float()
    return hi * 1.52587890625e-05 + (lo + 0.5) * 2.3283064365386963e-10


def uniform64(seed, pos, vocab_size: int) -> torch.Tensor:
    keys = _token_keys(vocab_size, seed.device)
    lo, hi = _hash_scrambled(seed, pos, keys), _hash_scrambled(seed, pos, keys, domain=0x9E3779B9)
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
    if fp64:
        return -torch.log(-torch.log(uniform64(seeds, positions, vocab_size)))
    return -torch.log(-_log1m(uniform32(seeds, positions, vocab_size)))


def gumbel_sample(logits, temperature, seeds, positions, *, apply_temperature=True, fp64=False):
    rows, vocab = logits.shape
    if rows == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    if not fp64:
        winners = native_gumbel.gumbel_sample(logits, temperature, seeds, positions,
                                              lambda s, p: _row_state(s, p, 0), apply_temperature)
        if winners is not None:
            return winners
    scores = logits.float()
    temp = temperature.float()
    random_rows = temp != 0.0
    if not bool(random_rows.any()):
        return scores.argmax(dim=-1)
    every_row = bool(random_rows.all())
    idx = None if every_row else random_rows.nonzero().view(-1)
    noisy, row_temp = (scores, temp) if every_row else (scores[idx], temp[idx])
    if apply_temperature:
        noisy = noisy / row_temp[:, None]
    if fp64:
        noisy = noisy.double()
    row_seeds, row_positions = (seeds, positions) if every_row else (seeds[idx], positions[idx])
    winners = (noisy + gumbel_noise(row_seeds, row_positions, vocab, fp64=fp64)).argmax(dim=-1)
    if every_row:
        return winners
    sampled = scores.argmax(dim=-1)
    sampled[idx] = winners
    return sampled
