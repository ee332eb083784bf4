"""The layerwise variant of the agent: the prefill side writes each layer into the decode side's blocks as soon as
that layer's KV is computed, instead of the decode side pulling everything after the prefill finished.

Flow (decode request first, as layerwise proxies do): the decode worker runs a `handoff.PushHandoff` (a
`PushRequest` with its metadata and block ids, then `StatusRequest`s, parked here until the transfer is DONE);
the prefill worker queues each layer's write from `save_kv_layer` on the decode peer's writer thread
(`p2p.peer_writers`), which waits for the layer's KV to be written on the device (`p2p.layer_written`) and then
writes it. When the request finished and its last write landed the transfer is DONE; the decode side reports the
blocks received and sends DONE so the prefill frees them. If a layer was computed before the destination was
known, everything is pushed once both the destination and the finished request are there (correct, just not
overlapped with compute).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.agent import MooncakeAgent
from ascend_kv_transfer.p2p.geometry import check_geometry, match_regions
from ascend_kv_transfer.p2p.handoff import PARK_S
from ascend_kv_transfer.p2p.layer_written import WRITTEN, KVWritten
from ascend_kv_transfer.p2p.peer_writers import PeerWriters
from ascend_kv_transfer.p2p.plan import Entries, build_entries, coalesce_runs
from ascend_kv_transfer.p2p.schema import LayerRegion, TransferState
from ascend_kv_transfer.p2p.side_channel import Deferred

logger = logging.getLogger(__name__)

# Bound on a push thread's wait for a layer's KV write on the device (a healthy step takes milliseconds).
KV_WRITTEN_TIMEOUT_S = 30.0
# Bound on waiting for writes already running before the KV memory is unregistered (queued ones are skipped).
DRAIN_S = 30.0


@dataclass
class PushState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    dest: schema.AgentMetadata | None = None
    dest_blocks: list[list[int]] = field(default_factory=list)
    first_block: int = 0
    pairs: dict[str, list[tuple[LayerRegion, LayerRegion]]] = field(default_factory=dict)  # by layer
    src_blocks: list[list[int]] = field(default_factory=list)
    missed: bool = False
    finished: bool = False
    writes_queued: int = 0
    state: TransferState = TransferState.PENDING
    error: str = ""

    @property
    def peer(self) -> str:
        assert self.dest is not None
        return f"{self.dest.host}:{self.dest.rpc_port}"

    def fail(self, error: str) -> None:
        if self.state == TransferState.PENDING:
            self.state, self.error = TransferState.FAILED, error


class LayerwiseAgent(MooncakeAgent):
    # The prefill pushes into each decode rank's blocks rank to rank: TP sizes must match (the geometry check says).
    reads_one_replica = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._pushes: dict[str, PushState] = {}
        self.writers = PeerWriters()
        self.layer_pushes = 0
        self.bulk_pushes = 0

    def _push_state(self, transfer_id: str) -> PushState:
        with self._lock:
            return self._pushes.setdefault(transfer_id, PushState())

    def unregister(self) -> None:
        """Fail the pushes and let the writes already on the wire finish (bounded) before the memory goes away."""
        with self._lock:
            pushes = list(self._pushes.values())
        for st in pushes:
            with st.lock:
                st.fail("the prefill's KV memory is being released")
        deadline = time.monotonic() + DRAIN_S
        while self.writes_queued() and time.monotonic() < deadline:
            time.sleep(0.001)
        if self.writes_queued():
            logger.error("%d layerwise writes still running after %.0f s", self.writes_queued(), DRAIN_S)
        super().unregister()

    def _memory_gone(self, why: str) -> None:
        super()._memory_gone(why)
        for st in self._pushes.values():  # pages computed into that memory are gone: their pushes can only fail
            with st.lock:
                st.fail(f"the prefill {why}")

    def drop_push(self, transfer_id: str) -> None:
        """The scheduler gave up on a transfer (request aborted): its queued writes must not land."""
        with self._lock:
            st = self._pushes.get(transfer_id)
        if st is not None:
            with st.lock:
                st.fail("the prefill request was aborted")

    def forget_expired_pushes(self) -> None:
        """Transfers the hold table freed for good (`holds.is_expired`) will never be asked about again."""
        with self._lock:
            for transfer_id in [t for t in self._pushes if self.holds.is_expired(t)]:
                del self._pushes[transfer_id]

    def close(self) -> None:
        self.writers.close()
        super().close()

    # ---- producer -----------------------------------------------------------------------------------------------
    def _handle(self, message: schema.AnyMessage) -> schema.Message | Deferred:
        if isinstance(message, schema.PushRequest):
            if message.metadata is None:
                raise ValueError("push request without the decode side's metadata")
            peer = f"{message.metadata.engine_id}@{message.metadata.host}:{message.metadata.rpc_port}"
            check_geometry(self.geometry, message.metadata.geometry, peer)
            assert self.kv is not None
            pairs: dict[str, list] = {}
            for mine, theirs in match_regions(self.kv.regions, message.metadata):  # a layer's planes together
                pairs.setdefault(mine.owner, []).append((mine, theirs))
            st = self._push_state(message.transfer_id)
            with st.lock:
                st.dest, st.dest_blocks, st.first_block, st.pairs = (message.metadata, message.block_ids,
                                                                     message.first_block, pairs)
                if st.finished and st.state == TransferState.PENDING:
                    self._queue_bulk(message.transfer_id, st)
            return schema.Ack()
        if isinstance(message, schema.StatusRequest):
            with self._lock:
                st = self._pushes.get(message.transfer_id)
            if st is None:
                return schema.StatusResponse(state=TransferState.UNKNOWN)
            if st.state == TransferState.PENDING:  # answered the moment the last write lands
                return Deferred(PARK_S, schema.StatusResponse(state=TransferState.PENDING))
            return schema.StatusResponse(state=st.state, error=st.error)
        if isinstance(message, (schema.DoneNotice, schema.ReleaseRequest)):
            with self._lock:
                st = self._pushes.pop(message.transfer_id, None)
            if st is not None:
                with st.lock:  # queued writes of a released transfer must not land in blocks the decode freed
                    st.fail("released by the decode side")
        return super()._handle(message)

    def known_destinations(self) -> list[str]:
        """Transfers whose decode side has registered its blocks and that are not pushed completely yet."""
        with self._lock:
            return [t for t, st in self._pushes.items() if st.dest is not None and st.state == TransferState.PENDING]

    def writes_queued(self) -> int:
        with self._lock:
            pushes = list(self._pushes.values())
        return sum(st.writes_queued for st in pushes)

    def push_layer(self, transfer_id: str, layer: str, src_blocks: list[list[int]], lo: int, hi: int,
                   written: KVWritten) -> None:
        """Queue the write of block positions `lo..hi` of `layer` (its KV is written once `written` says so) to the
        decode side, if it is known yet. Never waits: the forward pass calls this."""
        st = self._push_state(transfer_id)
        with st.lock:
            st.src_blocks = src_blocks
            if st.dest is None:
                st.missed = True
                return
            if st.state != TransferState.PENDING or layer not in st.pairs:
                return
            entries = self._entries(st, st.pairs[layer], lo, hi)
            if len(entries):
                self._queue(st, entries, written, bulk=False)

    def finish(self, transfer_id: str, src_blocks: list[list[int]]) -> None:
        """The prefill request finished: complete the transfer once its writes landed (or push it all once the
        destination is known)."""
        st = self._push_state(transfer_id)
        with st.lock:
            st.src_blocks, st.finished = src_blocks, True
            if st.dest is None or st.state != TransferState.PENDING:
                return
            if st.missed:
                self._queue_bulk(transfer_id, st)
            else:
                self._maybe_done(st)

    def _queue_bulk(self, transfer_id: str, st: PushState) -> None:
        """Every block of every layer (caller holds `st.lock`). The steps that computed them have finished (their
        outputs reached the scheduler before the request could finish), so the pages are written."""
        st.missed = False
        last = max((len(ids) for ids in st.src_blocks), default=0) - 1
        entries = self._entries(st, [pr for prs in st.pairs.values() for pr in prs], 0, last)
        if len(entries):
            self._queue(st, entries, WRITTEN, bulk=True)
        else:
            self._maybe_done(st)

    def _queue(self, st: PushState, entries: Entries, written: KVWritten, *, bulk: bool) -> None:
        peer = st.peer
        if not self.writers.submit(peer, lambda: self._write(st, peer, entries, written, bulk)):
            st.fail(f"decode peer {peer} has {self.writers.max_queued_per_peer} writes queued (stalled or gone): "
                    "the transfer is failed rather than queued behind them")
            return
        st.writes_queued += 1

    def _write(self, st: PushState, peer: str, entries: Entries, written: KVWritten, bulk: bool) -> None:
        """On the peer's writer thread."""
        try:
            with st.lock:
                live = st.state == TransferState.PENDING
            if not live:
                return
            if not written.wait(KV_WRITTEN_TIMEOUT_S):
                raise TimeoutError(f"the layer's KV write did not complete on the device within "
                                   f"{KV_WRITTEN_TIMEOUT_S:g} s")
            self.engine.write(peer, entries)
            with self._lock:
                if bulk:
                    self.bulk_pushes += 1
                else:
                    self.layer_pushes += 1
        except Exception as e:
            with st.lock:
                st.fail(f"{type(e).__name__}: {e}")
        finally:
            with st.lock:
                st.writes_queued -= 1
                self._maybe_done(st)

    @staticmethod
    def _maybe_done(st: PushState) -> None:
        if st.state == TransferState.PENDING and st.finished and not st.missed and st.writes_queued == 0:
            st.state = TransferState.DONE

    def _entries(self, st: PushState, pairs: list[tuple[LayerRegion, LayerRegion]], lo: int, hi: int) -> Entries:
        entries = Entries([], [], [])
        for group, src in enumerate(st.src_blocks):
            dst = st.dest_blocks[group] if group < len(st.dest_blocks) else []
            positions = [p for p in range(max(lo, st.first_block), hi + 1)
                         if p < len(src) and 0 <= p - st.first_block < len(dst)]
            if not positions:
                continue
            runs = coalesce_runs([src[p] for p in positions], [dst[p - st.first_block] for p in positions])
            part = build_entries([pr for pr in pairs if pr[0].group == group], runs)
            entries.local += part.local
            entries.remote += part.remote
            entries.lengths += part.lengths
        return entries
