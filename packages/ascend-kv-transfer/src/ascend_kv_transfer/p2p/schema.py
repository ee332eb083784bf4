"""The typed, versioned messages prefill and decode agents exchange over the ZMQ side channel.

Every message is a tagged msgspec struct carrying the schema version; a peer speaking another version is refused
with an error naming both versions instead of being decoded into something half right.
"""

from __future__ import annotations

import enum

import msgspec

# 2: the registration epoch in AgentMetadata and ClaimResponse (KV memory re-registered after sleep/wake).
# 3: KVGeometry.tp_replicated, readers in ClaimRequest/DoneNotice, DoneNotice.unread (MLA across TP sizes).
# 4: ReleaseRequest (the router gives a transfer up after its decode leg failed).
SCHEMA_VERSION = 4


class LayerRegion(msgspec.Struct, frozen=True):
    """Where one layer's pages live in an agent's registered memory.

    Block `b` of the layer is the `page_bytes` bytes at `base_addr + b * block_stride`.
    """

    name: str
    base_addr: int
    block_stride: int
    page_bytes: int
    num_blocks: int
    # Index of the KV cache group whose block ids address this layer.
    group: int = 0
    # The layer this region belongs to: `name` itself, or the layer of a plane region (`layer#part`).
    layer: str = ""

    @property
    def owner(self) -> str:
        """The layer whose KV this region holds."""
        return self.layer or self.name


class KVGeometry(msgspec.Struct, frozen=True):
    """What must be equal on both sides for the bytes of a block to mean the same thing."""

    block_size: int
    dtype: str
    num_kv_heads: int
    head_size: int
    layout: str
    tp_size: int = 1
    pp_size: int = 1
    pcp_size: int = 1
    # Every TP rank holds the same KV (MLA's latent): peers with another tp_size may read any rank's pages.
    tp_replicated: bool = False


class AgentMetadata(msgspec.Struct, frozen=True):
    engine_id: str
    host: str
    rpc_port: int
    geometry: KVGeometry
    regions: list[LayerRegion]
    tp_rank: int = 0
    pp_rank: int = 0
    pcp_rank: int = 0
    # Bumped each time the agent re-registers its KV memory (new addresses after sleep/wake): a peer holding
    # metadata of an older epoch must handshake again before it reads.
    epoch: int = 0


class ClaimStatus(enum.IntEnum):
    OK = 0
    # The prefill worker has not yet been told about the transfer (its engine step is in flight): ask again.
    NOT_READY = 1
    UNKNOWN = 2
    EXPIRED = 3


class Message(msgspec.Struct, tag=True, frozen=True):
    version: int = SCHEMA_VERSION


class MetadataRequest(Message, tag="metadata_request"):
    requester: str = ""


class MetadataResponse(Message, tag="metadata_response"):
    metadata: AgentMetadata | None = None


class ClaimRequest(Message, tag="claim"):
    transfer_id: str = ""
    requester: str = ""
    # Decode ranks that read this transfer from this prefill rank (more than one when the decode's TP is larger).
    readers: int = 1


class ClaimResponse(Message, tag="claim_response"):
    status: ClaimStatus = ClaimStatus.UNKNOWN
    # One list of block ids per KV cache group, in the prefill engine's numbering.
    block_ids: list[list[int]] = msgspec.field(default_factory=list)
    # The prefill's registration epoch: block ids are addresses only under the metadata of this epoch.
    epoch: int = 0


class DoneNotice(Message, tag="done"):
    """The decode side finished with a transfer (`ok=False`: gave up); the prefill side frees its blocks once all
    `readers` reported. `unread`: no decode rank reads this transfer from this prefill rank (another rank holding
    the same latent serves it), so its blocks are free now."""

    transfer_id: str = ""
    ok: bool = True
    readers: int = 1
    unread: bool = False


class ReleaseRequest(Message, tag="release"):
    """Whoever routed the request gives the transfer up (its decode leg failed): a prefill rank frees the blocks of
    a transfer no decode has claimed (a later claim hears EXPIRED, and the decode computes the prompt itself); a
    claimed one is left to its readers, who report DONE or give up themselves (freeing blocks a read may still be
    copying could put other requests' bytes into a decode's cache). A release that arrives before the hold frees the
    blocks the moment the hold lands."""

    transfer_id: str = ""
    reason: str = ""


class ReleaseResponse(Message, tag="release_response"):
    released: bool = False
    # Why not: "claimed" (a decode is reading it) or "unknown" (never held here, or already freed).
    reason: str = ""


class Ack(Message, tag="ack"):
    pass


class PushRequest(Message, tag="push_request"):
    """Layerwise: the decode side asks the prefill side to write the transfer's layers into its blocks."""

    transfer_id: str = ""
    metadata: AgentMetadata | None = None
    block_ids: list[list[int]] = msgspec.field(default_factory=list)
    # The decode side already holds this many leading blocks (local prefix hits): block_ids[g][i] receives the
    # prefill's block at position first_block + i.
    first_block: int = 0


class TransferState(enum.IntEnum):
    # Not all layers written yet: the layerwise protocol's "not ready" (ask again).
    PENDING = 0
    DONE = 1
    FAILED = 2
    UNKNOWN = 3


class StatusRequest(Message, tag="status_request"):
    transfer_id: str = ""


class StatusResponse(Message, tag="status_response"):
    state: TransferState = TransferState.UNKNOWN
    error: str = ""


class ErrorResponse(Message, tag="error"):
    error: str = ""


AnyMessage = (MetadataRequest | MetadataResponse | ClaimRequest | ClaimResponse | DoneNotice | Ack | ErrorResponse
              | PushRequest | StatusRequest | StatusResponse | ReleaseRequest | ReleaseResponse)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyMessage)


class SchemaError(RuntimeError):
    """A side-channel message could not be decoded or speaks another schema version."""


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> AnyMessage:
    try:
        message = _decoder.decode(data)
    except msgspec.DecodeError as e:
        raise SchemaError(f"undecodable side-channel message: {e}") from e
    if message.version != SCHEMA_VERSION:
        raise SchemaError(f"side-channel schema version {message.version} from peer, this agent speaks "
                          f"version {SCHEMA_VERSION}")
    return message
