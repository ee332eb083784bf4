"""The transfer agent behind the P2P connector, free of vLLM so benchmarks and tests can drive it with plain tensors.

A producer (prefill) agent registers its KV memory, serves its metadata over the side channel and holds blocks per
transfer until its consumers report DONE (all `readers` of it, or one "unread" notice: another rank with the same
latent serves the transfer, `p2p.rank_groups`) or `abort_timeout_s` passes; a claim for a transfer not held yet is
parked (`handoff.PARK_S`), a report for it is remembered until the hold lands. A consumer (decode) agent runs the
hand-off protocol of `p2p.handoff` (handshake with the geometry check, claim, not-ready back-off, batched reads of
coalesced runs, DONE or release); `pull` runs it to the end for callers without an engine, through the same driver
an engine uses (`p2p.step_driver`).

Registering again (the KV memory moved, e.g. after sleep/wake) replaces the registration and bumps the epoch that
metadata and claims carry, so peers holding the old addresses handshake again; held transfers are freed, since
their bytes went with the old memory.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ascend_kv_transfer.kv_regions import KVRegions
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.geometry import check_geometry, match_regions
from ascend_kv_transfer.p2p.handoff import PARK_S, PullHandoff, PullResult
from ascend_kv_transfer.p2p.plan import Entries, plan_groups
from ascend_kv_transfer.p2p.side_channel import Deferred, SideChannelClient, SideChannelServer
from ascend_kv_transfer.p2p.step_driver import StepDriver
from ascend_kv_transfer.p2p.transfer_engine import TransferEngineHandle

logger = logging.getLogger(__name__)

# Remember this many expired transfer ids so a late claim hears "expired" rather than "unknown".
_EXPIRED_MEMORY = 4096
# Reports (DONE / unread) that arrived before the transfer's hold, kept for the hold (bounded; dropped after the
# abort timeout).
_EARLY_MEMORY = 4096


@dataclass
class Reports:
    """What the decode side said about one transfer: freed when `reports` reach `readers`."""

    readers: int = 1
    reports: int = 0
    read: bool = False
    released: bool = False

    def give_up(self) -> None:
        """A release: complete now, whatever readers are outstanding."""
        self.reports = self.readers = max(self.readers, self.reports, 1)
        self.released = True

    def add(self, message: schema.DoneNotice) -> None:
        self.readers = max(self.readers, message.readers)
        self.reports += 1
        self.read = self.read or not message.unread

    @property
    def complete(self) -> bool:
        return self.reports >= self.readers


@dataclass
class HeldTransfer:
    req_id: str
    block_ids: list[list[int]]
    deadline: float
    claimed: bool = False
    reports: Reports = field(default_factory=Reports)


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
    # Freed on an "unread" notice: no decode rank reads this rank's copy of a replicated (MLA) transfer.
    released_unread: int = 0
    released_expired: int = 0
    # Freed on a ReleaseRequest (the router gave an unclaimed transfer up).
    released_by_request: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__, errors=list(self.errors[-20:]))


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
                                           max_batch_entries=options.max_batch_entries)
        self.kv: KVRegions | None = None
        self.stats = AgentStats()
        self._lock = threading.Lock()
        self._held: dict[str, HeldTransfer] = {}
        self._expired: dict[str, None] = {}
        self._early: dict[str, tuple[float, Reports]] = {}
        self._finished_sends: set[str] = set()
        self._server: SideChannelServer | None = None
        self._client: SideChannelClient | None = None
        self._peers: dict[tuple[str, int], schema.AgentMetadata] = {}
        self._blocking: StepDriver | None = None
        self._read_pool: ThreadPoolExecutor | None = None
        # Registrations so far: metadata and claims carry it, so a peer notices the memory moved.
        self.epoch = 0

    # ---- both roles -------------------------------------------------------------------------------------------
    def register(self, kv: KVRegions) -> None:
        """Register the KV memory; again when it moved (the old spans are unregistered, held transfers freed)."""
        self.engine.register(kv.storages)
        with self._lock:
            moved = self.epoch > 0
            self.kv = kv
            self.epoch += 1
            if moved:
                self._forget_held(f"its KV memory was re-registered (epoch {self.epoch})")

    def unregister(self) -> None:
        """The KV memory is about to be freed (sleep): drop it from Mooncake and free the held transfers. Until the
        next `register`, handshakes are refused and claims hear EXPIRED. Idempotent."""
        self.engine.register([])
        with self._lock:
            self.kv = None
            self._forget_held("its KV memory was released")

    def metadata(self) -> schema.AgentMetadata:
        if self.kv is None:
            raise RuntimeError("register() the KV caches before asking for agent metadata")
        tp, pp, pcp = self.ranks
        return schema.AgentMetadata(engine_id=self.engine_id, host=self.engine.host, rpc_port=self.engine.rpc_port,
                                    geometry=self.geometry, regions=list(self.kv.regions), tp_rank=tp, pp_rank=pp,
                                    pcp_rank=pcp, epoch=self.epoch)

    def close(self) -> None:
        if self._blocking is not None:
            self._blocking.close()
            self._blocking = None
        if self._read_pool is not None:
            self._read_pool.shutdown(wait=True)
            self._read_pool = None
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._client is not None:
            self._client.close()
            self._client = None
        self.engine.close()

    # ---- producer ---------------------------------------------------------------------------------------------
    def serve(self, port: int) -> None:
        self._server = SideChannelServer(self.options.side_channel_host, port, self._handle, auth=self.auth)

    def serve_pending(self) -> None:
        """Answer side-channel requests from the engine's thread (see `SideChannelServer`)."""
        if self._server is not None:
            self._server.serve_pending()

    def hold(self, transfer_id: str, req_id: str, block_ids: list[list[int]]) -> None:
        with self._lock:
            held = HeldTransfer(req_id, block_ids, time.monotonic() + self.options.abort_timeout_s)
            self.stats.held += 1
            early = self._early.pop(transfer_id, None)
            if early is not None and early[0] > time.monotonic():
                held.reports = early[1]
                if held.reports.complete:  # e.g. "unread" before the hold landed: free the blocks at once
                    if held.reports.released:
                        self._remember_expired(transfer_id)
                    self._release(transfer_id, held)
                    return
            self._held[transfer_id] = held

    def drop(self, transfer_id: str) -> None:
        """The scheduler gave up on a transfer (request aborted): forget it without reporting a send."""
        with self._lock:
            self._held.pop(transfer_id, None)
            self._early.pop(transfer_id, None)

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

    def refused(self) -> dict[str, int]:
        """Side-channel requests left unanswered for want of the shared secret, by reason."""
        return {} if self._server is None else self._server.refused

    def num_held(self) -> int:
        with self._lock:
            return len(self._held)

    def _forget_held(self, why: str) -> None:
        """Free every held transfer (caller holds the lock): a claim for one hears EXPIRED and recomputes."""
        for transfer_id, held in self._held.items():
            self._remember_expired(transfer_id)
            self._finished_sends.add(held.req_id)
            self.stats.released_expired += 1
        if self._held:
            logger.warning("freed %d held transfer(s): %s", len(self._held), why)
        self._held.clear()

    def _release(self, transfer_id: str, held: HeldTransfer) -> None:
        """Every reader reported (caller holds the lock): the blocks may be freed."""
        self._finished_sends.add(held.req_id)
        if held.reports.released:
            self.stats.released_by_request += 1
        elif held.reports.read:
            self.stats.released_done += 1
        else:
            self.stats.released_unread += 1

    def _remember_early(self, message: schema.DoneNotice | schema.ReleaseRequest) -> None:
        """A report for a transfer not held (caller holds the lock): its hold may be an engine step away."""
        if message.transfer_id in self._expired:
            return
        now = time.monotonic()
        until, reports = self._early.get(message.transfer_id, (now + self.options.abort_timeout_s, Reports()))
        if isinstance(message, schema.ReleaseRequest):
            reports.give_up()
        else:
            reports.add(message)
        self._early[message.transfer_id] = (until, reports)
        while len(self._early) > _EARLY_MEMORY or (self._early and next(iter(self._early.values()))[0] < now):
            self._early.pop(next(iter(self._early)))

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
                    return Deferred(PARK_S, schema.ClaimResponse(status=schema.ClaimStatus.NOT_READY))
                held.claimed = True
                held.reports.readers = max(held.reports.readers, message.readers)
                # The pull is under way: give it a full timeout from now.
                held.deadline = time.monotonic() + self.options.abort_timeout_s
                return schema.ClaimResponse(status=schema.ClaimStatus.OK, block_ids=held.block_ids, epoch=self.epoch)
        if isinstance(message, schema.DoneNotice):
            with self._lock:
                held = self._held.get(message.transfer_id)
                if held is None:
                    self._remember_early(message)
                else:
                    held.reports.add(message)
                    if held.reports.complete:
                        del self._held[message.transfer_id]
                        self._release(message.transfer_id, held)
            return schema.Ack()
        if isinstance(message, schema.ReleaseRequest):
            return self._release_on_request(message)
        raise ValueError(f"unexpected side-channel message {type(message).__name__}")

    def _release_on_request(self, message: schema.ReleaseRequest) -> schema.ReleaseResponse:
        """Free an unclaimed transfer now (see `schema.ReleaseRequest`); a claimed one is left to its readers."""
        with self._lock:
            held = self._held.get(message.transfer_id)
            if held is None:
                known = message.transfer_id in self._expired
                self._remember_early(message)
                reply = schema.ReleaseResponse(released=not known, reason="unknown" if known else "")
            elif held.claimed:
                reply = schema.ReleaseResponse(released=False, reason="claimed")
            else:
                del self._held[message.transfer_id]
                held.reports.give_up()
                self._remember_expired(message.transfer_id)
                self._release(message.transfer_id, held)
                reply = schema.ReleaseResponse(released=True)
        logger.info("transfer %s: release requested (%s): %s", message.transfer_id, message.reason or "no reason",
                    "freed" if reply.released else f"kept ({reply.reason})")
        return reply

    # ---- consumer ---------------------------------------------------------------------------------------------
    def _side_channel(self) -> SideChannelClient:
        if self._client is None:
            self._client = SideChannelClient(self.options.handshake_timeout_s, auth=self.auth)
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
        check_geometry(self.geometry, meta.geometry, f"{meta.engine_id}@{address[0]}:{address[1]}",
                       any_tp_if_replicated=self.reads_one_replica)
        self._peers[address] = meta
        return meta

    def forget_peer(self, address: tuple[str, int]) -> None:
        """After a failure: the next transfer handshakes again (the peer may have restarted with a new layout)."""
        self._peers.pop(address, None)

    def pull(self, address: tuple[str, int], transfer_id: str, local_block_ids: list[list[int]]) -> PullResult:
        """Fetch the transfer's blocks into `local_block_ids` (per group; the tail of the peer's blocks), blocking.

        For tools and benchmarks: the hand-off protocol and the driver a decode engine runs step by step
        (`p2p.step_driver`), driven here to the end in a bounded loop.
        """
        if self.kv is None:
            raise RuntimeError("register() the KV caches before pulling")
        if self._blocking is None:
            self._read_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ascend-kv-pull")
            self._blocking = StepDriver(self, lambda handoff, result: None, self._read_pool,
                                        inline_read_max_bytes=self.options.inline_read_max_bytes)
        options = self.options
        handoff = PullHandoff(req_id=transfer_id, transfer_id=transfer_id, address=address,
                              local_block_ids=local_block_ids, first_block=0,
                              deadline=time.monotonic() + options.claim_wait_s, wait_s=options.claim_wait_s)
        return self._blocking.run_blocking(handoff, bound_s=options.claim_wait_s + 4 * options.handshake_timeout_s
                                           + options.abort_timeout_s)

    def plan(self, meta: schema.AgentMetadata, local: list[list[int]], remote: list[list[int]]) -> Entries:
        assert self.kv is not None
        return plan_groups(match_regions(self.kv.regions, meta), local, remote)

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
