"""Pulls driven by the decode engine's own calls into the connector, so a waiting request needs no thread hand-offs.

Why not a background thread: while a request waits for its KV the engine loop steps without pause, so a pull thread
gets the GIL only when Python's 5 ms switch interval forces a hand-off, once per blocking call (handshake, claim,
read): ~20 ms to land a prompt whose transfer takes ~1 ms. Here each pull advances whenever the engine calls the
connector (`start_load_kv` at the start of a step, `get_finished` at its end):

    handshake (first pull from a peer) -> claim (retried with backoff while the prefill has not yet seen the
    transfer) -> read -> DONE

Side-channel round trips are asynchronous (sent now, their answers taken by a later poll), so a slow or dead prefill
costs the engine nothing but that request's bounded wait. A read up to `inline_read_max_bytes` runs in the call that
saw the claim answered, so the KV lands within that step; a larger one (or any read while another is on the
thread) goes to the background thread, so one long prompt does not stall the running batch and two reads never
share a peer's transfer queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.agent import MooncakeAgent, PullResult
from ascend_kv_transfer.p2p.scheduler_side import RecvJob
from ascend_kv_transfer.p2p.side_channel import AsyncSideChannelClient, PendingReply

logger = logging.getLogger(__name__)

_FIRST_RETRY_S = 0.001
_MAX_RETRY_S = 0.02

Report = Callable[[str, RecvJob, PullResult], None]


@dataclass
class _Pull:
    req_id: str
    job: RecvJob
    address: tuple[str, int]
    claim_deadline: float
    result: PullResult
    started: float = field(default_factory=time.perf_counter)
    meta: schema.AgentMetadata | None = None
    asked: PendingReply | None = None
    retry_at: float = 0.0
    delay: float = _FIRST_RETRY_S
    claimed: bool = False
    reading: Future | None = None


class StepDrivenPulls:
    def __init__(self, agent: MooncakeAgent, report: Report, pool: ThreadPoolExecutor, *, inline_read_max_bytes: int):
        self.agent = agent
        self.report = report
        self.pool = pool
        self.inline_read_max_bytes = inline_read_max_bytes
        self.channel = AsyncSideChannelClient(agent.options.handshake_timeout_s)
        self._pulls: list[_Pull] = []
        self.inline_reads = 0
        self.background_reads = 0

    def add(self, req_id: str, job: RecvJob, address: tuple[str, int]) -> None:
        if not any(job.local_block_ids):  # nothing to load: just let the prefill free its blocks
            self.channel.send(address, schema.DoneNotice(transfer_id=job.transfer_id, ok=False))
            return
        deadline = time.monotonic() + self.agent.options.claim_wait_s
        self._pulls.append(_Pull(req_id, job, address, deadline, PullResult(job.transfer_id, ok=False)))

    def waiting(self) -> int:
        return len(self._pulls)

    def advance(self) -> None:
        """Move every pull as far as it goes without waiting; report the ones that landed or failed."""
        if not self._pulls and not self.channel.in_flight():
            return
        self.channel.poll()
        remaining = []
        for pull in self._pulls:
            try:
                finished = self._advance(pull)
            except Exception as e:
                self._fail(pull, e)
                finished = True
            if not finished:
                remaining.append(pull)
        self._pulls = remaining

    def _advance(self, pull: _Pull) -> bool:
        if pull.reading is not None:
            if not pull.reading.done():
                return False
            pull.result.calls = pull.reading.result()  # re-raises the read's error
            return self._landed(pull)
        if pull.meta is None:
            pull.meta = self._peer(pull)
            if pull.meta is None:
                return False
        if pull.asked is None:
            if time.monotonic() < pull.retry_at:
                return False
            pull.asked = self.channel.send(pull.address, schema.ClaimRequest(transfer_id=pull.job.transfer_id,
                                                                             requester=self.agent.engine_id))
        if not pull.asked.done:
            return False
        reply = self._answer(pull)
        if not isinstance(reply, schema.ClaimResponse):
            raise RuntimeError(f"peer {pull.address} answered a claim with {type(reply).__name__}")
        if reply.status == schema.ClaimStatus.NOT_READY:
            if time.monotonic() > pull.claim_deadline:
                raise TimeoutError(f"transfer {pull.job.transfer_id!r} unknown at {pull.address} after "
                                   f"{self.agent.options.claim_wait_s} s")
            pull.retry_at = time.monotonic() + pull.delay
            pull.delay = min(pull.delay * 2, _MAX_RETRY_S)
            return False
        if reply.status != schema.ClaimStatus.OK:
            raise RuntimeError(f"transfer {pull.job.transfer_id!r} at {pull.address}: {reply.status.name.lower()} "
                               "(its blocks were freed, e.g. after abort_timeout_s)")
        pull.claimed = True
        return self._read(pull, reply.block_ids)

    def _peer(self, pull: _Pull) -> schema.AgentMetadata | None:
        """The peer's checked metadata, handshaking first if no pull has met this peer yet (None: not answered yet).

        Until it returns, `pull.asked` can only be this pull's own metadata request, even if another pull's
        handshake with the same peer finished meanwhile.
        """
        if pull.asked is None:
            known = self.agent.known_peer(pull.address)
            if known is not None:
                return known
            pull.asked = self.channel.send(pull.address, schema.MetadataRequest(requester=self.agent.engine_id))
        if not pull.asked.done:
            return None
        return self.agent.accept_peer(pull.address, self._answer(pull))

    def _read(self, pull: _Pull, remote_block_ids: list[list[int]]) -> bool:
        assert pull.meta is not None
        entries = self.agent.plan(pull.meta, pull.job.local_block_ids, remote_block_ids)
        pull.result.entries = len(entries)
        pull.result.nbytes = entries.nbytes
        peer = f"{pull.meta.host}:{pull.meta.rpc_port}"
        on_thread = any(p.reading is not None and not p.reading.done() for p in self._pulls)
        if entries.nbytes <= self.inline_read_max_bytes and not on_thread:
            self.inline_reads += 1
            pull.result.calls = self.agent.engine.read(peer, entries)
            return self._landed(pull)
        self.background_reads += 1
        pull.reading = self.pool.submit(self.agent.engine.read, peer, entries)
        return False

    @staticmethod
    def _answer(pull: _Pull) -> schema.AnyMessage:
        asked, pull.asked = pull.asked, None
        assert asked is not None
        if asked.error is not None:
            raise asked.error
        assert asked.reply is not None
        return asked.reply

    def _landed(self, pull: _Pull) -> bool:
        result = pull.result
        result.ok = True
        result.blocks = sum(len(ids) for ids in pull.job.local_block_ids)
        result.seconds = time.perf_counter() - pull.started
        self.agent.record(result)
        self.report(pull.req_id, pull.job, result)
        # Not awaited: if the notice is lost the prefill frees the blocks at its abort timeout.
        self.channel.send(pull.address, schema.DoneNotice(transfer_id=pull.job.transfer_id, ok=True))
        return True

    def _fail(self, pull: _Pull, error: Exception) -> None:
        result = pull.result
        result.error = f"{type(error).__name__}: {error}"
        result.seconds = time.perf_counter() - pull.started
        self.agent.forget_peer(pull.address)
        if pull.claimed or not isinstance(error, TimeoutError):  # a silent peer would not hear it anyway
            self.channel.send(pull.address, schema.DoneNotice(transfer_id=pull.job.transfer_id, ok=False))
        self.agent.record(result)
        self.report(pull.req_id, pull.job, result)

    def close(self) -> None:
        self.channel.close()
