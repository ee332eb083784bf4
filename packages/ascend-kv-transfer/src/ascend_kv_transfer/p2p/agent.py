"""The transfer agent behind the P2P connector, free of vLLM so benchmarks and tests can drive it with plain tensors.

An agent is one worker's KV memory registered with Mooncake (`p2p.transfer_engine`), the metadata describing it,
and the parts that work on it, each on its own:

    holds   the producer (prefill) side: blocks held per transfer until the decode side is done (`p2p.holds`),
            answered over the side channel this agent serves
    peers   the consumer (decode) side's book of prefill peers met in a handshake (`p2p.peers`)
    stats   what both sides counted (`p2p.stats`)

The agent drives nothing: a decode worker's hand-offs run on a `p2p.step_driver.StepDriver` built beside the agent
(the worker's, or a blocking caller's for tools and benchmarks: `StepDriver.pull`).

Registering again (the KV memory moved, e.g. after sleep/wake) replaces the registration and bumps the epoch that
metadata and claims carry, so peers holding the old addresses handshake again; held transfers are freed, since
their bytes went with the old memory.
"""

from __future__ import annotations

import threading

from ascend_kv_transfer.kv_regions import KVRegions
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.geometry import match_regions
from ascend_kv_transfer.p2p.holds import TransferHolds
from ascend_kv_transfer.p2p.peers import PeerBook
from ascend_kv_transfer.p2p.plan import Entries, plan_groups
from ascend_kv_transfer.p2p.side_channel import Deferred, SideChannelServer
from ascend_kv_transfer.p2p.stats import AgentStats
from ascend_kv_transfer.p2p.transfer_engine import TransferEngineHandle


class MooncakeAgent:
    # The consumer reads one whole prefill rank's pages, so replicated KV (MLA) may cross TP sizes (`rank_groups`).
    reads_one_replica = True

    def __init__(self, *, engine_id: str, geometry: schema.KVGeometry, options: MooncakeOptions,
                 tp_rank: int = 0, pp_rank: int = 0, pcp_rank: int = 0):
        self.engine_id = engine_id
        self.geometry = geometry
        self.options = options
        self.auth = options.side_channel_auth()
        self.ranks = (tp_rank, pp_rank, pcp_rank)
        self.engine = TransferEngineHandle(options.side_channel_host, options.protocol, options.device_name,
                                           max_batch_entries=options.max_batch_entries,
                                           broken_peer_retry_s=options.broken_peer_retry_s)
        self.kv: KVRegions | None = None
        self.stats = AgentStats()
        self.holds = TransferHolds(options.abort_timeout_s, self.stats)
        self.peers = PeerBook(geometry, any_tp_if_replicated=self.reads_one_replica)
        self._lock = threading.Lock()
        self._server: SideChannelServer | None = None
        # Registrations so far: metadata and claims carry it, so a peer notices the memory moved.
        self.epoch = 0

    def register(self, kv: KVRegions) -> None:
        """Register the KV memory; again when it moved (the old spans are unregistered, held transfers freed)."""
        self.engine.register(kv.storages)
        with self._lock:
            moved = self.epoch > 0
            self.kv = kv
            if moved:  # before the new epoch is out: a claim in between hears EXPIRED, not the old blocks
                self._memory_gone(f"its KV memory was re-registered (epoch {self.epoch + 1})")
            self.epoch += 1

    def unregister(self) -> None:
        """The KV memory is about to be freed (sleep): drop it from Mooncake and free the held transfers. Until the
        next `register`, handshakes are refused and claims hear EXPIRED. Idempotent."""
        self.engine.register([])
        with self._lock:
            self.kv = None
            self._memory_gone("its KV memory was released")

    def _memory_gone(self, why: str) -> None:
        """What lived in the old KV memory is gone (caller holds the lock)."""
        self.holds.forget_all(why)

    def metadata(self) -> schema.AgentMetadata:
        if self.kv is None:
            raise RuntimeError("register() the KV caches before asking for agent metadata")
        tp, pp, pcp = self.ranks
        return schema.AgentMetadata(engine_id=self.engine_id, host=self.engine.host, rpc_port=self.engine.rpc_port,
                                    geometry=self.geometry, regions=list(self.kv.regions), tp_rank=tp, pp_rank=pp,
                                    pcp_rank=pcp, epoch=self.epoch)

    def plan(self, meta: schema.AgentMetadata, local: list[list[int]], remote: list[list[int]]) -> Entries:
        """The transfer entries that read `remote` blocks of the peer `meta` into our `local` ones (per group)."""
        assert self.kv is not None
        return plan_groups(match_regions(self.kv.regions, meta), local, remote)

    # ---- the side channel (producer) ----------------------------------------------------------------------------
    def serve(self, port: int) -> None:
        self._server = SideChannelServer(self.options.side_channel_host, port, self._handle, auth=self.auth)

    def serve_pending(self) -> None:
        """Answer side-channel requests from the engine's thread (see `SideChannelServer`)."""
        if self._server is not None:
            self._server.serve_pending()

    def refused(self) -> dict[str, int]:
        """Side-channel requests left unanswered for want of the shared secret, by reason."""
        return {} if self._server is None else self._server.refused

    def _handle(self, message: schema.AnyMessage) -> schema.Message | Deferred:
        if isinstance(message, schema.MetadataRequest):
            return schema.MetadataResponse(metadata=self.metadata())
        return self.holds.answer(message, self.epoch)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.engine.close()
