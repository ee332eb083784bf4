"""Runs the decode side's hand-offs (`p2p.handoff`) on the engine's own calls, so a waiting request needs no thread.

Why not a background thread per wait: while a request waits for its KV the engine loop steps without pause, so a
thread gets the GIL only when Python's 5 ms switch interval forces a hand-off, once per blocking call (handshake,
claim, read): ~20 ms to land a prompt whose transfer takes ~1 ms; and a thread that waits for one request holds up
every request queued behind it. Here every hand-off advances whenever the engine calls the connector
(`start_load_kv` at the start of a step, `get_finished` at its end), each on its own:

    side-channel round trips are asynchronous (sent now, their answers taken by a later poll), so a slow or dead
    prefill costs the engine nothing but that request's bounded wait;
    a pull's read up to `inline_read_max_bytes` is waited for (up to `INLINE_READ_WAIT_S`) in the call that saw the
    claim answered, so the KV lands within that step; a larger one (or any read while another is on the thread, or
    an inline one that outlasts its wait: a stalled link) goes on on the background thread, so one long prompt or a
    dead peer does not stall the running batch and two reads never share a peer's transfer queue.

Ended hand-offs are returned by the call that ended them (`advance`, `abandon_all`), to the one caller on that
thread. `pull` drives the same machinery in a bounded loop for callers without an engine (benchmarks, tools), so
they measure the path engines take. The driver works on its agent's parts (peer book, stats, KV registration and
transfer engine); the agent knows nothing of drivers.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.handoff import Handoff, PullHandoff, PullResult
from ascend_kv_transfer.p2p.side_channel import AsyncSideChannelClient, PendingReply

if TYPE_CHECKING:
    from ascend_kv_transfer.p2p.agent import MooncakeAgent

logger = logging.getLogger(__name__)

Ended = list[tuple[Handoff, PullResult]]
# Replies one `advance` takes for one hand-off before moving on (handshake answer, then the ask sent at once).
_MOVES_PER_ADVANCE = 4
# Bound on waiting for reads already running when the hand-offs are abandoned (Mooncake times a transfer out itself).
DRAIN_S = 30.0
# How long one engine step waits for an inline read (`inline_read_max_bytes`): ample for 8 MiB over a healthy link,
# short enough that a read stalled on a dead link costs the running batch one short pause, not Mooncake's timeout.
INLINE_READ_WAIT_S = 0.05


@dataclass(eq=False)
class _Running:
    handoff: Handoff
    asked: PendingReply | None = None
    reading: Future | None = None


class StepDriver:
    def __init__(self, agent: MooncakeAgent, pool: ThreadPoolExecutor | None, *, inline_read_max_bytes: int):
        self.agent = agent
        self.pool = pool
        self.inline_read_max_bytes = inline_read_max_bytes
        self.channel = AsyncSideChannelClient(agent.options.handshake_timeout_s, auth=agent.auth)
        self._running: list[_Running] = []
        self.inline_reads = 0
        self.inline_overruns = 0  # inline reads that outlasted INLINE_READ_WAIT_S and went on on the thread
        self.background_reads = 0

    def add(self, handoff: Handoff) -> None:
        if not any(handoff.local_block_ids):  # nothing to receive: just let the prefill free its blocks
            self.channel.send(handoff.address, schema.DoneNotice(transfer_id=handoff.transfer_id, ok=False,
                                                                 readers=handoff.readers))
            return
        self._running.append(_Running(handoff))

    def release_unread(self, address: tuple[str, int], transfer_id: str) -> PendingReply:
        """Tell a prefill rank that nobody reads the transfer from it (a rank with the same latent serves it): it
        frees its blocks now. Not awaited: if the notice is lost the rank frees them at its abort timeout."""
        return self.channel.send(address, schema.DoneNotice(transfer_id=transfer_id, ok=True, unread=True))

    def waiting(self) -> int:
        return len(self._running)

    def advance(self) -> Ended:
        """Move every hand-off as far as it goes without waiting; returns the ones that landed or failed."""
        if not self._running and not self.channel.in_flight():
            return []
        self.channel.poll()
        remaining, ended = [], []
        for run in self._running:
            try:
                finished = self._advance(run)
            except Exception as e:
                self._fail(run, e)
                finished = True
            if finished:
                ended.append((run.handoff, run.handoff.result))
            else:
                remaining.append(run)
        self._running = remaining
        return ended

    def abandon_all(self, reason: str) -> Ended:
        """Fail every hand-off now (e.g. our KV memory is released under them); the prefills hear a release. A read
        already on the thread cannot be stopped: wait for it (bounded), so no transfer outlives the memory."""
        running, self._running = self._running, []
        reading = [run.reading for run in running if run.reading is not None and not run.reading.done()]
        if reading and wait(reading, timeout=DRAIN_S).not_done:
            logger.error("abandoned KV reads still running after %.0f s", DRAIN_S)
        for run in running:
            self._fail(run, RuntimeError(reason))
        return [(run.handoff, run.handoff.result) for run in running]

    def _advance(self, run: _Running) -> bool:
        h = run.handoff
        if run.reading is not None:
            if not run.reading.done():
                return False
            h.result.calls = run.reading.result()  # re-raises the read's error
            return self._landed(run)
        for _ in range(_MOVES_PER_ADVANCE):
            if run.asked is not None:
                if not run.asked.done:
                    return False
                asked, run.asked = run.asked, None
                if asked.error is not None:
                    raise asked.error
                h.take_reply(self.agent, asked.reply, time.monotonic())
            if h.ready:
                return self._read(run) if isinstance(h, PullHandoff) else self._landed(run)
            message = h.next_message(self.agent, time.monotonic())
            if message is None:
                return False
            run.asked = self.channel.send(h.address, message)
        return False

    def _read(self, run: _Running) -> bool:
        h = run.handoff
        assert h.meta is not None
        entries = self.agent.plan(h.meta, h.local_block_ids, h.remote_block_ids)
        h.result.entries, h.result.nbytes = len(entries), entries.nbytes
        h.result.layer_bytes = dict(entries.layer_bytes)
        peer = f"{h.meta.host}:{h.meta.rpc_port}"
        on_thread = any(r.reading is not None and not r.reading.done() for r in self._running)
        if self.pool is None:  # a blocking caller with no thread: it has nothing else to serve meanwhile
            self.inline_reads += 1
            h.result.calls = self.agent.engine.read(peer, entries)
            return self._landed(run)
        run.reading = self.pool.submit(self.agent.engine.read, peer, entries)
        if entries.nbytes <= self.inline_read_max_bytes and not on_thread:
            # Inline: the step waits for the read (the thread gets the GIL at once, as this one sleeps in the wait)
            # so a small read lands within it, but only up to INLINE_READ_WAIT_S: a read stalled on a cut or slow
            # link goes on on the thread instead of holding up every request of the engine until Mooncake gives up.
            self.inline_reads += 1
            if wait([run.reading], timeout=INLINE_READ_WAIT_S).done:
                reading, run.reading = run.reading, None
                h.result.calls = reading.result()  # re-raises the read's error
                return self._landed(run)
            self.inline_overruns += 1
            logger.warning("KV read of transfer %s (%d B from %s) not done within %.0f ms of the step; it goes on "
                           "on the thread", h.transfer_id, entries.nbytes, peer, 1000 * INLINE_READ_WAIT_S)
            return False
        self.background_reads += 1
        return False

    def _landed(self, run: _Running) -> bool:
        h = run.handoff
        result = h.result
        result.ok = True
        result.blocks = sum(len(ids) for ids in h.local_block_ids)
        if not result.nbytes and self.agent.kv is not None:  # a push: the prefill wrote whole blocks
            result.nbytes = result.blocks * self.agent.kv.bytes_per_block
        result.seconds = time.perf_counter() - h.started
        self.agent.stats.record(result)
        # Not awaited: if the notice is lost the prefill frees the blocks at its abort timeout.
        self.channel.send(h.address, schema.DoneNotice(transfer_id=h.transfer_id, ok=True, readers=h.readers))
        return True

    def _fail(self, run: _Running, error: Exception) -> None:
        h = run.handoff
        result = h.result
        result.error = f"{type(error).__name__}: {error}"
        result.seconds = time.perf_counter() - h.started
        self.agent.peers.forget(h.address)
        if h.release_after(error):
            self.channel.send(h.address, schema.DoneNotice(transfer_id=h.transfer_id, ok=False, readers=h.readers))
        self.agent.stats.record(result)

    def pull(self, address: tuple[str, int], transfer_id: str, local_block_ids: list[list[int]]) -> PullResult:
        """Fetch the transfer's blocks into `local_block_ids` (per group; the tail of the peer's blocks), blocking:
        one hand-off (and nothing else) driven to its end in a bounded loop, for callers with no engine loop."""
        if self.agent.kv is None:
            raise RuntimeError("register() the KV caches before pulling")
        if self._running:
            raise RuntimeError("a blocking pull needs a driver of its own (this one has hand-offs in flight)")
        options = self.agent.options
        handoff = PullHandoff(req_id=transfer_id, transfer_id=transfer_id, address=address,
                              local_block_ids=local_block_ids, first_block=0,
                              deadline=time.monotonic() + options.claim_wait_s, wait_s=options.claim_wait_s)
        bound_s = options.claim_wait_s + 4 * options.handshake_timeout_s + options.abort_timeout_s
        self.add(handoff)
        deadline = time.monotonic() + bound_s
        while self._running:
            self.advance()
            if not self._running:
                break
            if time.monotonic() > deadline:  # every step of the protocol is bounded; this is a backstop
                self.abandon_all(f"transfer {transfer_id!r} still running after {bound_s:g} s")
                break
            run = self._running[0]
            if run.reading is not None:  # the read is on the thread: sleep on it, not on the sockets
                wait([run.reading], timeout=0.1)
            else:
                self.channel.wait(_wait_s(run))
        # The DONE or release went out unanswered: wait for the peer to take it (bounded by the side channel's
        # timeout), so a blocking caller returns with the prefill's blocks already released.
        while self.channel.in_flight():
            self.channel.wait(0.005)
            self.channel.poll()
        return handoff.result

    def close(self) -> None:
        self.channel.close()


def _wait_s(run: _Running) -> float:
    """How long a blocking caller may sleep on the side channel before the hand-off can move again."""
    if run.asked is not None:
        return 0.005  # the wait ends as soon as the answer arrives
    return max(0.0, min(run.handoff.retry_at - time.monotonic(), 0.005))
