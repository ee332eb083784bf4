"""Block hashes every engine computes alike: a SHA-256 chain over each full block's token ids and extra keys.

vLLM's own block hashes start from `NONE_HASH`, which is derived from `PYTHONHASHSEED` when it is set (and from a
random seed for the non-cryptographic algorithms), so two engines with different seeds never share a block (the
zero-hit reports of LMCache 1139). The pool therefore chains its own hashes from a fixed root. The per-block extra
keys (multimodal inputs, LoRA name, cache salt, prompt embeddings) are vLLM's own (`generate_block_hash_extra_keys`),
serialised with msgpack, so requests vLLM would not share a block between do not share one in the pool either.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any

import msgspec

ROOT_HASH = hashlib.sha256(b"ascend-kv-transfer/kv-pool/v1").digest()

_encoder = msgspec.msgpack.Encoder(enc_hook=repr)


def chain_hash(parent: bytes, token_ids: Any, extra_keys: Any = None) -> bytes:
    tokens = struct.pack(f"<{len(token_ids)}q", *token_ids)
    extra = _encoder.encode(extra_keys) if extra_keys else b""
    return hashlib.sha256(parent + struct.pack("<I", len(tokens)) + tokens + extra).digest()


def _extra_keys(request: Any, start: int, end: int, mm_idx: int) -> tuple[Any, int]:
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

    return generate_block_hash_extra_keys(request, start, end, mm_idx)


@dataclass
class _Chain:
    hashes: list[bytes] = field(default_factory=list)
    next_mm_idx: int = 0


class RequestHashes:
    """Per-request hash chains, extended as blocks fill and dropped when the request finishes."""

    def __init__(self, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size={block_size}")
        self.block_size = block_size
        self._chains: dict[str, _Chain] = {}

    def get(self, request: Any, num_blocks: int) -> list[bytes]:
        """Hashes of the request's first `num_blocks` full blocks (fewer if its tokens do not fill them)."""
        chain = self._chains.setdefault(request.request_id, _Chain())
        tokens = request.all_token_ids
        num_blocks = min(num_blocks, len(tokens) // self.block_size)
        while len(chain.hashes) < num_blocks:
            start = len(chain.hashes) * self.block_size
            end = start + self.block_size
            extra, chain.next_mm_idx = _extra_keys(request, start, end, chain.next_mm_idx)
            parent = chain.hashes[-1] if chain.hashes else ROOT_HASH
            chain.hashes.append(chain_hash(parent, tokens[start:end], extra))
        return chain.hashes[:num_blocks]

    def drop(self, request_id: str) -> None:
        self._chains.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._chains)
