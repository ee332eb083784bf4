"""The P2P hand-off protocol as the decode side runs it, written once: handshake, ask, not ready, timeout, release.

Every way a decode worker gets a prefill's KV is one `Handoff` per transfer:

    handshake   MetadataRequest; geometry checked (skipped for a peer already met at its current epoch)
    ask         pull:      ClaimRequest  -> OK (the prefill's block ids) | NOT_READY | UNKNOWN / EXPIRED
                layerwise: PushRequest (our block ids) once, then StatusRequest -> DONE | PENDING | FAILED / UNKNOWN
    not ready   ask again after the back-off (`RETRY_FIRST_S`, doubling up to `RETRY_MAX_S`) until the deadline
                (`claim_wait_s` for a claim, `abort_timeout_s` for a push), then `TimeoutError`
    ready       pull: the caller reads the blocks; layerwise: the bytes are in our blocks already
    finish      DoneNotice(ok=True), so the prefill frees its blocks; after a failure a release,
                DoneNotice(ok=False), unless the peer never answered (`SideChannelTimeout`: it would not hear it)

The machine does no I/O: it says which message to send next and takes the replies. The step driver
(`p2p.step_driver`) runs it, on the engine's calls or, for tools and benchmarks, blocking (`StepDriver.pull`), so
tools, benchmarks and engines speak the same protocol with the same back-off. The prefill side answers an ask that
is not ready yet by parking it for up to `PARK_S` and answering the moment it becomes ready; the back-off only paces
asks that outlive a park.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.side_channel import SideChannelTimeout

RETRY_FIRST_S = 0.001
"""Pause before asking again after the first not-ready answer."""
RETRY_MAX_S = 0.02
"""Cap of the doubling pause: past a park, a transfer that became ready is seen at most this late."""
PARK_S = 0.25
"""How long the prefill side holds a not-ready ask before answering NOT_READY / PENDING: well under any
side-channel timeout, long enough to cover the engine step that delivers the hold or the last layer's write."""


class TransferGoneError(RuntimeError):
    """The prefill side no longer has the transfer (freed after `abort_timeout_s`, released, or never known)."""


@dataclass
class PullResult:
    """How one hand-off ended (a layerwise push reports through the same record)."""

    transfer_id: str
    ok: bool
    blocks: int = 0
    nbytes: int = 0
    entries: int = 0
    calls: int = 0
    seconds: float = 0.0
    error: str | None = None
    # Bytes read per layer (a pull; a push reports none): what each cache kind of a hybrid model moved.
    layer_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class Handoff:
    """One transfer seen from the decode side. Subclasses say what "ask" means (`_ask`, `_on_answer`)."""

    req_id: str
    transfer_id: str
    address: tuple[str, int]
    # Per KV cache group, our blocks that receive the transfer (the tail of the prefill's blocks).
    local_block_ids: list[list[int]]
    # Leading blocks we already had (local prefix hits): local_block_ids follow them.
    first_block: int
    # Monotonic time after which a not-ready answer is final.
    deadline: float
    wait_s: float
    # Decode ranks that read this transfer from the same prefill rank (`p2p.rank_groups`): claims and DONE say so.
    readers: int = 1
    started: float = field(default_factory=time.perf_counter)
    meta: schema.AgentMetadata | None = None
    granted: bool = False
    remote_block_ids: list[list[int]] = field(default_factory=list)
    # The message whose answer we wait for: "metadata" or "ask".
    awaiting: str | None = None
    retry_at: float = 0.0
    delay: float = RETRY_FIRST_S
    result: PullResult = field(init=False)

    def __post_init__(self) -> None:
        self.result = PullResult(self.transfer_id, ok=False)

    @property
    def ready(self) -> bool:
        """Granted by a peer whose current metadata we hold: read (pull) or report (push)."""
        return self.granted and self.meta is not None and self.awaiting is None

    def next_message(self, agent, now: float) -> schema.Message | None:
        """What to send now; None while an answer or the back-off is pending (or when ready)."""
        if self.awaiting is not None:
            return None
        if self.meta is None:
            known = agent.peers.known(self.address)
            if known is None:
                self.awaiting = "metadata"
                return schema.MetadataRequest(requester=agent.engine_id)
            self._met(known)
        if self.granted or now < self.retry_at:
            return None
        self.awaiting = "ask"
        return self._ask(agent)

    def take_reply(self, agent, reply: schema.AnyMessage, now: float) -> None:
        """Advance on the answer to the message `next_message` gave; raises when the hand-off failed."""
        what, self.awaiting = self.awaiting, None
        if what == "metadata":
            self._met(agent.peers.accept(self.address, reply))
        elif what == "ask":
            self._on_answer(agent, reply, now)
        else:
            raise RuntimeError(f"transfer {self.transfer_id!r}: a reply nobody asked for ({type(reply).__name__})")

    def not_ready(self, now: float, what: str) -> None:
        if now > self.deadline:
            raise TimeoutError(f"transfer {self.transfer_id!r} {what} at {self.address} after {self.wait_s:g} s")
        self.retry_at = now + self.delay
        self.delay = min(self.delay * 2, RETRY_MAX_S)

    def release_after(self, error: BaseException) -> bool:
        """Whether to tell the prefill side we gave up: always, unless it never answered at all."""
        return not isinstance(error, SideChannelTimeout)

    def _met(self, meta: schema.AgentMetadata) -> None:
        self.meta = meta

    def _ask(self, agent) -> schema.Message:
        raise NotImplementedError

    def _on_answer(self, agent, reply: schema.AnyMessage, now: float) -> None:
        raise NotImplementedError


@dataclass(eq=False)
class PullHandoff(Handoff):
    """Claim the prefill's blocks, then the caller reads them."""

    claim_epoch: int | None = None

    def _ask(self, agent) -> schema.Message:
        return schema.ClaimRequest(transfer_id=self.transfer_id, requester=agent.engine_id, readers=self.readers)

    def _on_answer(self, agent, reply: schema.AnyMessage, now: float) -> None:
        if not isinstance(reply, schema.ClaimResponse):
            raise RuntimeError(f"peer {self.address} answered a claim with {type(reply).__name__}")
        if reply.status == schema.ClaimStatus.NOT_READY:
            self.not_ready(now, "unknown")
            return
        if reply.status != schema.ClaimStatus.OK:
            raise TransferGoneError(f"transfer {self.transfer_id!r} at {self.address}: {reply.status.name.lower()} "
                                    "(its blocks were freed, e.g. after abort_timeout_s)")
        self.granted, self.remote_block_ids, self.claim_epoch = True, reply.block_ids, reply.epoch
        if self.meta is not None and self.meta.epoch != reply.epoch:
            # The prefill re-registered its KV memory since we met it (sleep/wake): its regions moved.
            agent.peers.forget(self.address)
            self.meta = None

    def _met(self, meta: schema.AgentMetadata) -> None:
        if self.claim_epoch is not None and meta.epoch != self.claim_epoch:
            raise TransferGoneError(f"transfer {self.transfer_id!r} at {self.address}: the prefill re-registered its "
                                    f"KV memory (epoch {self.claim_epoch} -> {meta.epoch}) while we claimed it")
        self.meta = meta


@dataclass(eq=False)
class PushHandoff(Handoff):
    """Layerwise: hand our block ids to the prefill, then wait until it has written every layer into them."""

    registered: bool = False

    def _ask(self, agent) -> schema.Message:
        if not self.registered:
            return schema.PushRequest(transfer_id=self.transfer_id, metadata=agent.metadata(),
                                      block_ids=self.local_block_ids, first_block=self.first_block)
        return schema.StatusRequest(transfer_id=self.transfer_id)

    def _on_answer(self, agent, reply: schema.AnyMessage, now: float) -> None:
        if not self.registered:
            if not isinstance(reply, schema.Ack):
                raise RuntimeError(f"peer {self.address} answered a push request with {type(reply).__name__}")
            self.registered, self.retry_at = True, now  # ask for the status at once (it parks until DONE)
            return
        if not isinstance(reply, schema.StatusResponse):
            raise RuntimeError(f"peer {self.address} answered a status request with {type(reply).__name__}")
        if reply.state == schema.TransferState.PENDING:
            self.not_ready(now, "not pushed")
            return
        if reply.state == schema.TransferState.DONE:
            self.granted = True
            return
        if reply.state == schema.TransferState.FAILED:
            raise RuntimeError(f"prefill side failed pushing transfer {self.transfer_id!r}: {reply.error}")
        raise TransferGoneError(f"transfer {self.transfer_id!r} at {self.address}: unknown to the prefill side "
                                "(expired or released)")
