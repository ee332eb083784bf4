"""The producer (prefill) side of P2P: blocks held per transfer until the decode side is done with them.

A hold is freed when its consumers report DONE (all `readers` of it, or one "unread" notice: another rank with the
same latent serves the transfer, `p2p.rank_groups`), when the router releases it unclaimed (`ReleaseRequest`), or
when `abort_timeout_s` passes. A claim for a transfer not held yet is parked (`handoff.PARK_S`): the hold is usually
one engine step away; a report for it is remembered until the hold lands. Holds, drops and `take_finished_sends`
come from the engine's thread, the side channel's answers from its server thread: the table has its own lock.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.handoff import PARK_S
from ascend_kv_transfer.p2p.side_channel import Deferred
from ascend_kv_transfer.p2p.stats import AgentStats

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


class TransferHolds:
    def __init__(self, abort_timeout_s: float, stats: AgentStats):
        self.abort_timeout_s = abort_timeout_s
        self.stats = stats
        self._lock = threading.Lock()
        self._held: dict[str, HeldTransfer] = {}
        self._expired: dict[str, None] = {}
        self._early: dict[str, tuple[float, Reports]] = {}
        self._finished_sends: set[str] = set()

    # ---- the engine's thread ------------------------------------------------------------------------------------
    def hold(self, transfer_id: str, req_id: str, block_ids: list[list[int]]) -> None:
        with self._lock:
            held = HeldTransfer(req_id, block_ids, time.monotonic() + self.abort_timeout_s)
            self.stats.held += 1
            early = self._early.pop(transfer_id, None)
            if early is not None and early[0] > time.monotonic():
                held.reports = early[1]
                if held.reports.complete:  # e.g. "unread" before the hold landed: free the blocks at once
                    if held.reports.released:
                        self._remember_expired(transfer_id)
                    self._release(held)
                    return
            self._held[transfer_id] = held

    def drop(self, transfer_id: str) -> None:
        """The scheduler gave up on a transfer (request aborted): forget it without reporting a send."""
        with self._lock:
            self._held.pop(transfer_id, None)
            self._early.pop(transfer_id, None)

    def take_finished_sends(self) -> set[str]:
        """Request ids whose blocks may be freed: pulled (DONE), released, or expired unclaimed."""
        now = time.monotonic()
        with self._lock:
            for transfer_id, held in list(self._held.items()):
                if held.deadline < now:
                    del self._held[transfer_id]
                    self._remember_expired(transfer_id)
                    self._finished_sends.add(held.req_id)
                    self.stats.released_expired += 1
                    logger.warning("transfer %s (request %s) not %s within %.1f s: freeing its blocks", transfer_id,
                                   held.req_id, "finished" if held.claimed else "claimed", self.abort_timeout_s)
            done, self._finished_sends = self._finished_sends, set()
        return done

    def forget_all(self, why: str) -> None:
        """The KV memory went away: free every hold; a claim for one hears EXPIRED (the decode side recomputes)."""
        with self._lock:
            for transfer_id, held in self._held.items():
                self._remember_expired(transfer_id)
                self._finished_sends.add(held.req_id)
                self.stats.released_expired += 1
            if self._held:
                logger.warning("freed %d held transfer(s): %s", len(self._held), why)
            self._held.clear()

    def num_held(self) -> int:
        with self._lock:
            return len(self._held)

    def is_expired(self, transfer_id: str) -> bool:
        """Freed for good (timed out, released, or its memory gone): nobody may ask for it again."""
        with self._lock:
            return transfer_id in self._expired

    # ---- the side channel's answers -----------------------------------------------------------------------------
    def answer(self, message: schema.AnyMessage, epoch: int) -> schema.Message | Deferred:
        """A claim, DONE or release from a decode side (or router); `epoch`: the registration claims carry."""
        if isinstance(message, schema.ClaimRequest):
            return self._claim(message, epoch)
        if isinstance(message, schema.DoneNotice):
            self._done(message)
            return schema.Ack()
        if isinstance(message, schema.ReleaseRequest):
            return self._release_on_request(message)
        raise ValueError(f"unexpected side-channel message {type(message).__name__}")

    def _claim(self, message: schema.ClaimRequest, epoch: int) -> schema.Message | Deferred:
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
            held.deadline = time.monotonic() + self.abort_timeout_s
            return schema.ClaimResponse(status=schema.ClaimStatus.OK, block_ids=held.block_ids, epoch=epoch)

    def _done(self, message: schema.DoneNotice) -> None:
        with self._lock:
            held = self._held.get(message.transfer_id)
            if held is None:
                self._remember_early(message)
            else:
                held.reports.add(message)
                if held.reports.complete:
                    del self._held[message.transfer_id]
                    self._release(held)

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
                self._release(held)
                reply = schema.ReleaseResponse(released=True)
        logger.info("transfer %s: release requested (%s): %s", message.transfer_id, message.reason or "no reason",
                    "freed" if reply.released else f"kept ({reply.reason})")
        return reply

    # ---- under the lock -----------------------------------------------------------------------------------------
    def _release(self, held: HeldTransfer) -> None:
        """Every reader reported: the blocks may be freed."""
        self._finished_sends.add(held.req_id)
        if held.reports.released:
            self.stats.released_by_request += 1
        elif held.reports.read:
            self.stats.released_done += 1
        else:
            self.stats.released_unread += 1

    def _remember_early(self, message: schema.DoneNotice | schema.ReleaseRequest) -> None:
        """A report for a transfer not held: its hold may be an engine step away."""
        if message.transfer_id in self._expired:
            return
        now = time.monotonic()
        until, reports = self._early.get(message.transfer_id, (now + self.abort_timeout_s, Reports()))
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
