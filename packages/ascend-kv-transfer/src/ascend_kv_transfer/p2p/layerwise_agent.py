"""The layerwise variant of the agent: the prefill side writes each layer into the decode side's blocks as soon as
that layer's KV is computed, instead of the decode side pulling everything after the prefill finished.

Flow (decode request first, as layerwise proxies do): the decode worker sends a `PushRequest` with its metadata and
block ids; the prefill worker pushes layer by layer from `save_kv_layer`; when the request finishes it marks the
transfer DONE, and the decode worker, polling `StatusRequest`, reports the blocks received and sends DONE so the
prefill side frees them. If a layer was computed before the destination was known, everything is pushed once both
the destination and the finished request are there (correct, just not overlapped with compute).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.agent import MooncakeAgent, PullResult
from ascend_kv_transfer.p2p.geometry import check_geometry, match_regions
from ascend_kv_transfer.p2p.plan import Entries, build_entries, coalesce_runs
from ascend_kv_transfer.p2p.schema import LayerRegion, TransferState
from ascend_kv_transfer.p2p.side_channel import Deferred


@dataclass
class PushState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    dest: schema.AgentMetadata | None = None
    dest_blocks: list[list[int]] = field(default_factory=list)
    first_block: int = 0
    pairs: dict[str, tuple[LayerRegion, LayerRegion]] = field(default_factory=dict)
    src_blocks: list[list[int]] = field(default_factory=list)
    missed: bool = False
    finished: bool = False
    state: TransferState = TransferState.PENDING
    error: str = ""


class LayerwiseAgent(MooncakeAgent):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._pushes: dict[str, PushState] = {}
        self.layer_pushes = 0
        self.bulk_pushes = 0

    def _push_state(self, transfer_id: str) -> PushState:
        with self._lock:
            return self._pushes.setdefault(transfer_id, PushState())

    # ---- producer -----------------------------------------------------------------------------------------------
    def _handle(self, message: schema.AnyMessage) -> schema.Message | Deferred:
        if isinstance(message, schema.PushRequest):
            if message.metadata is None:
                raise ValueError("push request without the decode side's metadata")
            peer = f"{message.metadata.engine_id}@{message.metadata.host}:{message.metadata.rpc_port}"
            check_geometry(self.geometry, message.metadata.geometry, peer)
            assert self.kv is not None
            pairs = {mine.name: (mine, theirs) for mine, theirs in match_regions(self.kv.regions, message.metadata)}
            st = self._push_state(message.transfer_id)
            with st.lock:
                st.dest, st.dest_blocks, st.first_block, st.pairs = (message.metadata, message.block_ids,
                                                                     message.first_block, pairs)
                if st.finished and st.state == TransferState.PENDING:
                    self._push_everything(st)
            return schema.Ack()
        if isinstance(message, schema.StatusRequest):
            with self._lock:
                st = self._pushes.get(message.transfer_id)
            if st is None:
                return schema.StatusResponse(state=TransferState.UNKNOWN)
            return schema.StatusResponse(state=st.state, error=st.error)
        if isinstance(message, schema.DoneNotice):
            with self._lock:
                self._pushes.pop(message.transfer_id, None)
        return super()._handle(message)

    def take_finished_sends(self) -> set[str]:
        done = super().take_finished_sends()
        with self._lock:  # transfers that expired will never be asked about again
            for transfer_id in [t for t in self._pushes if t in self._expired]:
                del self._pushes[transfer_id]
        return done

    def known_destinations(self) -> list[str]:
        """Transfers whose decode side has registered its blocks and that are not pushed completely yet."""
        with self._lock:
            return [t for t, st in self._pushes.items() if st.dest is not None and st.state == TransferState.PENDING]

    def push_layer(self, transfer_id: str, layer: str, src_blocks: list[list[int]], lo: int, hi: int) -> None:
        """Write block positions `lo..hi` of `layer` (just computed) to the decode side, if it is known yet."""
        st = self._push_state(transfer_id)
        with st.lock:
            st.src_blocks = src_blocks
            if st.dest is None:
                st.missed = True
                return
            if st.state != TransferState.PENDING or layer not in st.pairs:
                return
            try:
                self._write(st, [st.pairs[layer]], lo, hi)
                self.layer_pushes += 1
            except Exception as e:
                st.state, st.error = TransferState.FAILED, f"{type(e).__name__}: {e}"

    def finish(self, transfer_id: str, src_blocks: list[list[int]]) -> None:
        """The prefill request finished: complete the transfer now or as soon as the destination is known."""
        st = self._push_state(transfer_id)
        with st.lock:
            st.src_blocks, st.finished = src_blocks, True
            if st.dest is not None and st.state == TransferState.PENDING:
                if st.missed:
                    self._push_everything(st)
                else:
                    st.state = TransferState.DONE

    def _push_everything(self, st: PushState) -> None:
        try:
            last = max((len(ids) for ids in st.src_blocks), default=0) - 1
            self._write(st, list(st.pairs.values()), 0, last)
            self.bulk_pushes += 1
            st.state = TransferState.DONE
        except Exception as e:
            st.state, st.error = TransferState.FAILED, f"{type(e).__name__}: {e}"

    def _write(self, st: PushState, pairs: list[tuple[LayerRegion, LayerRegion]], lo: int, hi: int) -> None:
        assert st.dest is not None
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
        if len(entries):
            self.engine.write(f"{st.dest.host}:{st.dest.rpc_port}", entries)

    # ---- consumer -----------------------------------------------------------------------------------------------
    def await_push(self, address: tuple[str, int], transfer_id: str, local_block_ids: list[list[int]],
                   first_block: int) -> PullResult:
        start = time.perf_counter()
        result = PullResult(transfer_id, ok=False)
        try:
            self.peer_metadata(address)
            client = self._side_channel()
            client.request(address, schema.PushRequest(transfer_id=transfer_id, metadata=self.metadata(),
                                                       block_ids=local_block_ids, first_block=first_block))
            deadline = time.monotonic() + self.options.abort_timeout_s
            delay = 0.001
            while True:
                reply = client.request(address, schema.StatusRequest(transfer_id=transfer_id))
                if reply.state == TransferState.DONE:
                    break
                if reply.state == TransferState.FAILED:
                    raise RuntimeError(f"prefill side failed pushing transfer {transfer_id!r}: {reply.error}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"transfer {transfer_id!r} not pushed within {self.options.abort_timeout_s} s")
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
            client.request(address, schema.DoneNotice(transfer_id=transfer_id, ok=True))
            assert self.kv is not None
            result.blocks = sum(len(ids) for ids in local_block_ids)
            result.nbytes = result.blocks * self.kv.bytes_per_block
            result.ok = True
        except Exception as e:
            result.error = f"{type(e).__name__}: {e}"
            self.forget_peer(address)
            if not isinstance(e, TimeoutError):
                self.release(address, transfer_id)
        result.seconds = time.perf_counter() - start
        self.record(result)
        return result
