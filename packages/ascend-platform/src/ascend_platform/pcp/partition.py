"""How a step's tokens split across prefill-context-parallel ranks, as plain numbers (no tensors, no vLLM).

Each prefill of length L is cut into 2·P chunks of ceil(L / 2P) tokens; rank r takes chunk r (head) and
chunk 2P-1-r (tail). Under a causal mask a late chunk costs more than an early one, so pairing them gives every rank the
same attention work (PCP=2: rank 0 = chunks 0 and 3, rank 1 = chunks 1 and 2). Decodes are not split: every rank
gets the whole query, or, with `shard_decode_requests`, one owner rank in turn. This is the rule vLLM's MRV2
`PCPManager` applies; `rank_token_counts` lets the graph planner size a step before the manager partitions it, and
a test checks the two agree.
"""

from __future__ import annotations

import numpy as np


def head_tail_chunks(query_len: int, pcp_size: int, rank: int) -> tuple[tuple[int, int], ...]:
    """`(offset, length)` of the chunks rank `rank` owns of one prefill, head chunk first; empty chunks omitted."""
    if not 0 <= rank < pcp_size:
        raise ValueError(f"rank {rank} is outside the PCP group of size {pcp_size}")
    num_chunks = 2 * pcp_size
    chunk = -(-query_len // num_chunks)
    out = []
    for idx in (rank, num_chunks - 1 - rank):
        offset = idx * chunk
        length = min(chunk, query_len - offset)
        if length > 0:
            out.append((offset, length))
    return tuple(out)


def rank_token_counts(
    num_scheduled_tokens: np.ndarray,
    is_prefilling: np.ndarray,
    pcp_size: int,
    *,
    shard_decode_requests: bool = False,
) -> np.ndarray:
    """Real (unpadded) token count of each PCP rank's local batch for one step."""
    counts = np.zeros(pcp_size, dtype=np.int64)
    decode_ordinal = 0
    for query_len, prefilling in zip(
        np.asarray(num_scheduled_tokens).tolist(), np.asarray(is_prefilling).tolist(), strict=True
    ):
        if query_len == 0:
            continue
        if prefilling:
            for rank in range(pcp_size):
                counts[rank] += sum(length for _, length in head_tail_chunks(query_len, pcp_size, rank))
        elif shard_decode_requests:
            counts[decode_ordinal % pcp_size] += query_len
            decode_ordinal += 1
        else:
            counts += query_len
    return counts


def local_tokens_after_padding(real_local_tokens: int, descriptor_tokens: int | None) -> int:
    """Token count a rank's local batch is padded to: the graph descriptor's, but never fewer than the real tokens.

    A descriptor chosen from a smaller count (the seed bug: a 151-token local batch against a 76-token descriptor)
    must not cut real tokens off; the step then runs at the real count.
    """
    if real_local_tokens < 0:
        raise ValueError(f"real_local_tokens must be >= 0, got {real_local_tokens}")
    if descriptor_tokens is None:
        return real_local_tokens
    return max(real_local_tokens, int(descriptor_tokens))
