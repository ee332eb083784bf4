"""The side-channel port scheme: one port per worker, laid out by dp, then pp x pcp, then tp rank.

`port = base + dp_rank * (tp * pp * pcp) + (pp_rank * pcp + pcp_rank) * tp + tp_rank`. The scheduler advertises the
port of its engine's first worker (the `dp_rank` term) and its TP size; a decode worker adds the offset of the prefill
worker it talks to (`peer_offset`): same pp and pcp ranks as its own (the handshake insists on equal pp/pcp sizes),
the TP rank `p2p.rank_groups` picks, laid out by the prefill's TP size.
"""

from __future__ import annotations

from ascend_kv_transfer.ranks import RankCoords


def peer_offset(ranks: RankCoords, peer_tp_size: int, peer_tp_rank: int) -> int:
    """Offset from a peer engine's advertised port to its worker with our pp/pcp ranks and TP rank `peer_tp_rank`."""
    if not 0 <= peer_tp_rank < peer_tp_size:
        raise ValueError(f"peer tp_rank={peer_tp_rank} outside peer tp_size={peer_tp_size}")
    return (ranks.pp_rank * ranks.pcp_size + ranks.pcp_rank) * peer_tp_size + peer_tp_rank


def engine_port(base: int, ranks: RankCoords) -> int:
    """The port a scheduler advertises in `kv_transfer_params` (its engine's first worker)."""
    return _checked(base + ranks.engine_offset)


def worker_port(base: int, ranks: RankCoords) -> int:
    """The port this worker's side channel binds."""
    return _checked(base + ranks.engine_offset + ranks.worker_offset)


def _checked(port: int) -> int:
    if not 1 <= port <= 65535:
        raise ValueError(f"side channel port {port} out of range; lower kv_connector_extra_config['side_channel_port']")
    return port
