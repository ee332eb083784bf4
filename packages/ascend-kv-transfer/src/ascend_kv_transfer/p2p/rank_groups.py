"""Which prefill TP rank a decode TP rank reads a transfer from, and which prefill ranks it lets go unread.

With equal TP sizes, rank r reads rank r (each holds its own slice of heads). When every TP rank holds the same KV
(MLA's latent: `kv_lora_rank` + rope per token, no heads to split), the sizes may differ, and one copy per decode
rank is all that has to move:

    prefill TP = k x decode TP   decode rank d owns the group of prefill ranks d*k .. d*k+k-1 (identical latents).
                                 It reads ONE of them, picked from the transfer id so that requests spread over the
                                 group, and tells the other k-1 to free their blocks at once (no reader is coming).
    decode TP = k x prefill TP   decode ranks d*... share prefill rank d // k: each reads the whole latent from it,
                                 and that rank frees its blocks once all k readers have reported.

The pick is deterministic (CRC-32 of the transfer id), so every rank of a decode engine and any tool reproduce it.
Sizes that do not divide one another are refused (a rank's group would be ragged), as vLLM's connectors do.
Without replication the pairing stays rank to rank; a size mismatch is then refused at the handshake by the
geometry check, which names `tp_size`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ReadPlan:
    """One decode rank's share of a transfer."""

    # The prefill TP rank this decode rank reads the pages from.
    source: int
    # Decode ranks that read `source` (the prefill frees its blocks after that many reports).
    readers: int = 1
    # Prefill TP ranks nobody reads this transfer from, that this decode rank tells to free their blocks.
    release: tuple[int, ...] = ()


def plan_reads(decode_rank: int, decode_tp: int, prefill_tp: int, *, replicated: bool, transfer_id: str) -> ReadPlan:
    """The plan of decode TP rank `decode_rank` for one transfer (`replicated`: every TP rank holds the same KV)."""
    if not 0 <= decode_rank < decode_tp:
        raise ValueError(f"decode_rank={decode_rank} outside decode_tp={decode_tp}")
    if prefill_tp < 1:
        raise ValueError(f"prefill_tp={prefill_tp}")
    if decode_tp == prefill_tp:
        return ReadPlan(decode_rank)
    if not replicated:
        # A rank that exists on the prefill, so the handshake reaches it and its geometry check names tp_size.
        return ReadPlan(decode_rank % prefill_tp)
    if prefill_tp > decode_tp:
        if prefill_tp % decode_tp:
            raise ValueError(f"prefill TP size {prefill_tp} is not a multiple of decode TP size {decode_tp}")
        k = prefill_tp // decode_tp
        group = range(decode_rank * k, (decode_rank + 1) * k)
        source = group[zlib.crc32(transfer_id.encode()) % k]
        return ReadPlan(source, 1, tuple(r for r in group if r != source))
    if decode_tp % prefill_tp:
        raise ValueError(f"decode TP size {decode_tp} is not a multiple of prefill TP size {prefill_tp}")
    k = decode_tp // prefill_tp
    return ReadPlan(decode_rank // k, k)
