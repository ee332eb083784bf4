"""The transfer agent behind the P2P connector, free of vLLM so benchmarks and tests can drive it with plain tensors.

A producer (prefill) agent registers its KV memory, serves its metadata over the side channel and holds blocks per
transfer until the consumer reports DONE or `abort_timeout_s` passes. A consumer (decode) agent handshakes (checking
geometry), claims the transfer (the prefill side then keeps the blocks while the pull runs), reads the blocks with
batched reads of coalesced runs, and sends DONE.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from ascend_kv_transfer.kv_regions import KVRegions
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.geometry import check_geometry, match_regions
from ascend_kv_transfer.p2p.plan import Entries, build_entries, coalesce_runs
from ascend_kv_transfer.p2p.side_channel import Deferred, SideChannelClient, SideChannelServer
from ascend_kv_transfer.p2p.transfer_engine import TransferEngineHandle

logger = logging.getLogger(__name__)

# A claim for a transfer this prefill has not held yet waits here this long before hearing NOT_READY (and retrying):
# well under any side-channel timeout, long enough to cover the engine step that delivers the hold.
_CLAIM_PARK_S = 0.25
# Remember this many expired transfer ids so a late claim hears "expired" rather than "unknown".
_EXPIRED_MEMORY = 4096


@dataclass
class HeldTransfer:
    req_id: str
    block_ids: list[list[int]]
    deadline: float
    claimed: bool = False


@dataclass
class PullResult:
    transfer_id: str
    ok: bool
    blocks: int = 0
    nbytes: int = 0
    entries: int = 0
    calls: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass
class AgentStats:
    pulls_ok: int = 0
    pulls_failed: int = 0
    blocks_pulled: int = 0
    bytes_pulled: int = 0
    transfer_entries: int = 0
    transfer_calls: int = 0
    held: int = 0
    released_done: int = 0
    released_expired: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__, errors=list(self.errors[-20:]))


class MooncakeAgent:
    def __init__(self, *, engine_id: str, geometry: schema.KVGeometry, options: MooncakeOptions,
                 tp_rank: int = 0, pp_rank: int = 0, pcp_rank: int = 0):
        self.engine_id = engine_id
        self.geometry = geometry
        self.options = options
        self.ranks = (tp_rank, pp_rank, pcp_rank)
        self.engine = TransferEngineHandle(options.side_channel_host, options.protocol, options.device_name,
                                           max_batch_entries=options.max_batch_entries)
        self.kv: KVRegions | None = None
        self.stats = AgentStats()
        self._lock = threading.Lock()
        self._held: dict[str, HeldTransfer] = {}
        self._expired: dict[str, None] = {}
        self._finished_sends: set[str] = set()
        self._server: SideChannelServer | None = None
        self._client: SideChannelClient | None = None
        self._peers: dict[tuple[str, int], schema.AgentMetadata] = {}

    # ---- both roles -------------------------------------------------------------------------------------------
    def register(self, kv: KVRegions) -> None:
        self.engine.register(kv.storages)
        self.kv = kv

    def metadata(self) -> schema.AgentMetadata:
        if self.kv is None:
            raise RuntimeError("register() the KV caches before asking for agent metadata")
        tp, pp, pcp = self.ranks
        return schema.AgentMetadata(engine_id=self.engine_id, host=self.engine.host, rpc_port=self.engine.rpc_port,
                                    geometry=self.geometry, regions=list(self.kv.regions), tp_rank=tp, pp_rank=pp,
                                    pcp_rank=pcp)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._client is not None:
            self._client.close()
            self._client = None
        self.engine.close()

    # ---- producer ---------------------------------------------------------------------------------------------
    def serve(self, port: int) -> None:
        self._server = SideChannelServer(self.options.side_channel_host, port, self._handle)

    def serve_pending(self) -> None:
        """Answer side-channel requests from the engine's thread (see `SideChannelServer`)."""
        if self._server is not None:
            self._server.serve_pending()

    def hold(self, transfer_id: str, req_id: str, block_ids: list[list[int]]) -> None:
        with self._lock:
            self._held[transfer_id] = HeldTransfer(req_id, block_ids, time.monotonic() + self.options.abort_timeout_s)
            self.stats.held += 1

    def drop(self, transfer_id: str) -> None:
        """The scheduler gave up on a transfer (request aborted): forget it without reporting a send."""
        with self._lock:
            self._held.pop(transfer_id, None)

    def take_finished_sends(self) -> set[str]:
        """Request ids whose blocks may be freed: pulled (DONE) or expired unclaimed."""
        now = time.monotonic()
        with self._lock:
            for transfer_id, held in list(self._held.items()):
                if held.deadline < now:
                    del self._held[transfer_id]
                    self._remember_expired(transfer_id)
                    self._finished_sends.add(held.req_id)
                    self.stats.released_expired += 1
                    logger.warning("transfer %s (request %s) not %s within %.1f s: freeing its blocks", transfer_id,
                                   held.req_id, "finished" if held.claimed else "claimed", self.options.abort_timeout_s)
            done, self._finished_sends = self._finished_sends, set()
        return done

    def num_held(self) -> int:
        with self._lock:
            return len(self._held)

    def _remember_expired(self, transfer_id: str) -> None:
        self._expired[transfer_id] = None
        while len(self._expired) > _EXPIRED_MEMORY:
            self._expired.pop(next(iter(self._expired)))

    def _handle(self, message: schema.AnyMessage) -> schema.Message | Deferred:
        if isinstance(message, schema.MetadataRequest):
            return schema.MetadataResponse(metadata=self.metadata())
        if isinstance(message, schema.ClaimRequest):
            with self._lock:
                held = self._held.get(message.transfer_id)
                if held is None:
                    if message.transfer_id in self._expired:
                        return schema.ClaimResponse(status=schema.ClaimStatus.EXPIRED)
                    # Usually the hold is one engine step away: answer the moment it lands, not on a retry.
                    return Deferred(_CLAIM_PARK_S, schema.ClaimResponse(status=schema.ClaimStatus.NOT_READY))
                held.claimed = True
                # The pull is under way: give it a full timeout from now.
                held.deadline = time.monotonic() + self.options.abort_timeout_s
                return schema.ClaimResponse(status=schema.ClaimStatus.OK, block_ids=held.block_ids)
        if isinstance(message, schema.DoneNotice):
            with self._lock:
                held = self._held.pop(message.transfer_id, None)
                if held is not None:
                    self._finished_sends.add(held.req_id)
                    self.stats.released_done += 1
            return schema.Ack()
        raise ValueError(f"unexpected side-channel message {type(message).__name__}")

    # ---- consumer ---------------------------------------------------------------------------------------------
    def _side_channel(self) -> SideChannelClient:
        if self._client is None:
            self._client = SideChannelClient(self.options.handshake_timeout_s)
        return self._client

    def peer_metadata(self, address: tuple[str, int]) -> schema.AgentMetadata:
        meta = self._peers.get(address)
        if meta is None:
            reply = self._side_channel().request(address, schema.MetadataRequest(requester=self.engine_id))
            meta = self.accept_peer(address, reply)
        return meta

    def known_peer(self, address: tuple[str, int]) -> schema.AgentMetadata | None:
        return self._peers.get(address)

    def accept_peer(self, address: tuple[str, int], reply: schema.AnyMessage) -> schema.AgentMetadata:
        """Check a handshake reply against our geometry (the error names the field) and remember the peer."""
        if not isinstance(reply, schema.MetadataResponse) or reply.metadata is None:
            raise RuntimeError(f"peer {address} answered the handshake with {type(reply).__name__}")
        meta = reply.metadata
        check_geometry(self.geometry, meta.geometry, f"{meta.engine_id}@{address[0]}:{address[1]}")
        self._peers[address] = meta
        return meta

    def forget_peer(self, address: tuple[str, int]) -> None:
        """After a failure: the next transfer handshakes again (the peer may have restarted with a new layout)."""
        self._peers.pop(address, None)

    def pull(self, address: tuple[str, int], transfer_id: str, local_block_ids: list[list[int]]) -> PullResult:
        """Fetch the transfer's blocks into `local_block_ids` (per group; the tail of the peer's blocks), blocking.

        For tools, benchmarks and tests; a decode engine pulls through `p2p.step_pulls`, which never blocks.
        """
        start = time.perf_counter()
        result = PullResult(transfer_id, ok=False)
        claimed = False
        try:
            if self.kv is None:
                raise RuntimeError("register() the KV caches before pulling")
            meta = self.peer_metadata(address)
            remote_ids = self._claim(address, transfer_id)
            claimed = True
            entries = self.plan(meta, local_block_ids, remote_ids)
            result.calls = self.engine.read(f"{meta.host}:{meta.rpc_port}", entries)
            result.entries = len(entries)
            result.nbytes = entries.nbytes
            result.blocks = sum(len(ids) for ids in local_block_ids)
            result.ok = True
            self._side_channel().request(address, schema.DoneNotice(transfer_id=transfer_id, ok=True))
        except Exception as e:
            if result.ok:  # only the DONE notice failed: the blocks landed; the prefill side frees them on timeout
                logger.warning("DONE for transfer %s not delivered: %s", transfer_id, e)
            else:
                result.error = f"{type(e).__name__}: {e}"
                self.forget_peer(address)
                if claimed or not isinstance(e, TimeoutError):
                    self.release(address, transfer_id)
        result.seconds = time.perf_counter() - start
        self.record(result)
        return result

    def release(self, address: tuple[str, int], transfer_id: str) -> None:
        """Tell the prefill side we will not pull (best effort, bounded by the side-channel timeout)."""
        try:
            self._side_channel().request(address, schema.DoneNotice(transfer_id=transfer_id, ok=False))
        except Exception as e:
            logger.warning("could not release transfer %s at %s: %s", transfer_id, address, e)

    def _claim(self, address: tuple[str, int], transfer_id: str) -> list[list[int]]:
        deadline = time.monotonic() + self.options.claim_wait_s
        delay = 0.001
        while True:
            reply = self._side_channel().request(address, schema.ClaimRequest(transfer_id=transfer_id,
                                                                              requester=self.engine_id))
            if not isinstance(reply, schema.ClaimResponse):
                raise RuntimeError(f"peer {address} answered a claim with {type(reply).__name__}")
            if reply.status == schema.ClaimStatus.OK:
                return reply.block_ids
            if reply.status != schema.ClaimStatus.NOT_READY:
                raise RuntimeError(f"transfer {transfer_id!r} at {address}: {reply.status.name.lower()} "
                                   "(its blocks were freed, e.g. after abort_timeout_s)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"transfer {transfer_id!r} unknown at {address} after {self.options.claim_wait_s} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def plan(self, meta: schema.AgentMetadata, local: list[list[int]], remote: list[list[int]]) -> Entries:
        assert self.kv is not None
        pairs = match_regions(self.kv.regions, meta)
        entries = Entries([], [], [])
        for group, local_ids in enumerate(local):
            if not local_ids:
                continue
            if group >= len(remote) or len(remote[group]) < len(local_ids):
                have = len(remote[group]) if group < len(remote) else 0
                raise RuntimeError(f"group {group}: {len(local_ids)} blocks to load but the peer holds {have}")
            tail = remote[group][len(remote[group]) - len(local_ids):]
            group_pairs = [(mine, theirs) for mine, theirs in pairs if mine.group == group]
            part = build_entries(group_pairs, coalesce_runs(local_ids, tail))
            entries.local += part.local
            entries.remote += part.remote
            entries.lengths += part.lengths
        return entries

    def record(self, result: PullResult) -> None:
        with self._lock:
            if result.ok:
                self.stats.pulls_ok += 1
                self.stats.blocks_pulled += result.blocks
                self.stats.bytes_pulled += result.nbytes
                self.stats.transfer_entries += result.entries
                self.stats.transfer_calls += result.calls
            else:
                self.stats.pulls_failed += 1
                self.stats.errors.append(f"{result.transfer_id}: {result.error}")
                del self.stats.errors[:-20]
                logger.error("KV pull of transfer %s failed: %s", result.transfer_id, result.error)
