"""The consumer side's book of prefill peers: their metadata (KV regions, epoch) by side-channel address.

A peer enters the book through a handshake whose reply passed the geometry check (`p2p.geometry`: the error names
the field), and leaves it after any failed hand-off or a claim carrying another epoch, so the next transfer
handshakes again (the peer may have restarted or moved its KV memory).
"""

from __future__ import annotations

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.geometry import check_geometry

Address = tuple[str, int]


class PeerBook:
    def __init__(self, geometry: schema.KVGeometry, *, any_tp_if_replicated: bool):
        self.geometry = geometry
        # The P2P pull reads one whole prefill rank, so replicated KV (MLA) may cross TP sizes; a push may not.
        self.any_tp_if_replicated = any_tp_if_replicated
        self._peers: dict[Address, schema.AgentMetadata] = {}

    def known(self, address: Address) -> schema.AgentMetadata | None:
        return self._peers.get(address)

    def accept(self, address: Address, reply: schema.AnyMessage) -> schema.AgentMetadata:
        """Check a handshake reply against our geometry and remember the peer."""
        if not isinstance(reply, schema.MetadataResponse) or reply.metadata is None:
            raise RuntimeError(f"peer {address} answered the handshake with {type(reply).__name__}")
        meta = reply.metadata
        check_geometry(self.geometry, meta.geometry, f"{meta.engine_id}@{address[0]}:{address[1]}",
                       any_tp_if_replicated=self.any_tp_if_replicated)
        self._peers[address] = meta
        return meta

    def forget(self, address: Address) -> None:
        self._peers.pop(address, None)
