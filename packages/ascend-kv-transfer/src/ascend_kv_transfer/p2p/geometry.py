"""Handshake checks: two agents may exchange blocks only when their KV geometry and layer layout agree."""

from __future__ import annotations

from ascend_kv_transfer.p2p.schema import AgentMetadata, KVGeometry, LayerRegion


class GeometryMismatchError(RuntimeError):
    """The peer's KV cache differs from ours in a way that would make copied bytes meaningless."""

    def __init__(self, field: str, local: object, remote: object, peer: str) -> None:
        super().__init__(f"KV geometry mismatch with peer {peer}: {field} is {local!r} here but {remote!r} on the peer")
        self.field = field


def check_geometry(local: KVGeometry, remote: KVGeometry, peer: str, *, any_tp_if_replicated: bool = False) -> None:
    """Raise `GeometryMismatchError` naming the first field that differs.

    `any_tp_if_replicated`: the caller reads one whole rank's pages (`p2p.rank_groups`), so when both sides hold
    the same KV on every TP rank (MLA's latent) their TP sizes may differ; every other field must still match, and
    the per-layer page sizes are compared by `match_regions`.
    """
    fields = ["block_size", "dtype", "num_kv_heads", "head_size", "layout", "tp_replicated", "pp_size", "pcp_size"]
    if not (any_tp_if_replicated and local.tp_replicated and remote.tp_replicated):
        # First: with heads split over ranks, a TP mismatch is the cause of any head-count difference.
        fields.insert(2, "tp_size")
    for field in fields:
        mine, theirs = getattr(local, field), getattr(remote, field)
        if mine != theirs:
            raise GeometryMismatchError(field, mine, theirs, peer)


def match_regions(local: list[LayerRegion], remote: AgentMetadata) -> list[tuple[LayerRegion, LayerRegion]]:
    """Pair our layer regions with the peer's by layer name; every layer and page size must match."""
    theirs = {r.name: r for r in remote.regions}
    peer = f"{remote.engine_id}@{remote.host}:{remote.rpc_port}"
    pairs = []
    for region in local:
        other = theirs.get(region.name)
        if other is None:
            raise GeometryMismatchError(f"layer {region.name!r}", "present", "missing", peer)
        if other.page_bytes != region.page_bytes:
            raise GeometryMismatchError(f"page_bytes of layer {region.name!r}", region.page_bytes, other.page_bytes,
                                        peer)
        pairs.append((region, other))
    if len(theirs) != len(local):
        extra = sorted(set(theirs) - {r.name for r in local})
        raise GeometryMismatchError("layers", len(local), len(theirs), f"{peer} (extra: {extra[:4]})")
    return pairs
