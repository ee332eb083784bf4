"""Scheduler half of the P2P connector: decides what to pull and what to hold, speaks the router's params.

`kv_transfer_params` follow vLLM's disaggregation router convention, so existing proxies drive this unchanged:
the prefill request carries `{do_remote_decode: True, transfer_id?}` (a missing transfer_id is derived from the
request id); the prefill's output params carry `{do_remote_prefill: True, remote_engine_id, remote_bootstrap_addr,
remote_host, remote_port, remote_tp_size, transfer_id, remote_block_ids}` which the decode request passes back
(`remote_tp_size`: the prefill's TP size, so a decode rank finds the prefill rank it reads; missing means equal).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p.ports import engine_port
from ascend_kv_transfer.ranks import RankCoords

logger = logging.getLogger(__name__)


@dataclass
class RecvJob:
    transfer_id: str
    address: tuple[str, int]
    remote_engine_id: str
    # Per KV cache group; empty lists mean "nothing to pull, just release the prefill's blocks".
    local_block_ids: list[list[int]]
    # Leading blocks the decode side already had (local prefix hits); local_block_ids follow them.
    first_block: int = 0
    # The prefill engine's TP size (None: as ours).
    remote_tp_size: int | None = None


@dataclass
class SendJob:
    transfer_id: str
    block_ids: list[list[int]]


@dataclass
class P2PStep:
    """What the scheduler tells the workers this step (the connector metadata's payload)."""

    recv: dict[str, RecvJob] = field(default_factory=dict)
    send: dict[str, SendJob] = field(default_factory=dict)
    dropped_transfers: set[str] = field(default_factory=set)


def parse_address(params: dict[str, Any]) -> tuple[str, int] | None:
    addr = params.get("remote_bootstrap_addr")
    if isinstance(addr, str) and ":" in addr:
        host, _, port = addr.rpartition(":")
        return host.strip("[]"), int(port)
    if params.get("remote_host") and params.get("remote_port"):
        return str(params["remote_host"]), int(params["remote_port"])
    return None


class P2PScheduler:
    def __init__(self, *, engine_id: str, role: str, options: MooncakeOptions, ranks: RankCoords, block_size: int,
                 state_groups: bool = False):
        self.engine_id = engine_id
        self.is_producer = role in ("kv_producer", "kv_both")
        self.is_consumer = role in ("kv_consumer", "kv_both")
        self.options = options
        self.port = engine_port(options.side_channel_port, ranks)
        self.tp_size = ranks.tp_size
        self.workers = ranks.tp_size * ranks.pp_size * ranks.pcp_size
        self.block_size = block_size
        # A model with recurrent-state groups (GDN / Mamba): vLLM's decode recomputes a fully loaded prompt's last
        # token, which would apply it to a state that already holds it. So the prefill stops one token short (its
        # state is h(N-1)) and the decode loads N-1 tokens and computes the last itself, as upstream's Mooncake does.
        self.state_groups = state_groups
        self._step = P2PStep()
        # request id -> external tokens scheduled for loading (the "did not recompute" evidence).
        self.loaded_tokens: dict[str, int] = {}

    # ---- decode side --------------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return 0, False
        if not self.is_consumer:
            raise ValueError(f"request {request.request_id} asks to load remote KV (do_remote_prefill) but this "
                             "engine's kv_role is not kv_consumer/kv_both")
        prompt = len(request.prompt_token_ids or ())
        count = (prompt - 1 if self.state_groups and prompt > 1 else prompt) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    # ---- prefill side -------------------------------------------------------------------------------------------
    def on_new_request(self, request: Any) -> None:
        """With state groups, a prefill for a remote decode computes all but the prompt's last token (see
        `state_groups`); done once per request (a preempted request comes back with its params marked)."""
        params = request.kv_transfer_params
        if (not self.state_groups or not params or not params.get("do_remote_decode")
                or params.get("_prompt_shortened") or request.num_prompt_tokens < 2
                or request.prompt_token_ids is None or request.get_skip_reading_prefix_cache()):
            return
        request.prompt_token_ids.pop()
        request._all_token_ids.pop()  # the request's token list vLLM schedules from; no public setter
        request.num_prompt_tokens -= 1
        request.max_tokens = 1
        params["_prompt_shortened"] = True

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params:
            return
        if params.get("do_remote_prefill"):
            address = parse_address(params)
            if address is None or not params.get("transfer_id"):
                logger.warning("request %s: do_remote_prefill without remote_bootstrap_addr/remote_host+port or "
                               "transfer_id (%s); computing it locally", request.request_id, sorted(params))
            else:
                local = ([list(ids) for ids in blocks.get_unhashed_block_ids_all_groups()]
                         if num_external_tokens > 0 else [])
                first = len(blocks.get_block_ids()[0]) - len(local[0]) if local else 0
                self._step.recv[request.request_id] = RecvJob(str(params["transfer_id"]), address,
                                                             str(params.get("remote_engine_id", "")), local, first,
                                                             _remote_tp_size(params))
                self.loaded_tokens[request.request_id] = num_external_tokens
                while len(self.loaded_tokens) > 256:  # recent requests only
                    self.loaded_tokens.pop(next(iter(self.loaded_tokens)))
            params["do_remote_prefill"] = False  # one transfer per request, even if it is rescheduled

    def request_finished(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params
        if not params:
            return False, None
        if params.get("do_remote_prefill"):
            # Finished before it was scheduled (aborted): release the prefill's blocks without pulling.
            address = parse_address(params)
            if address is not None and params.get("transfer_id"):
                self._step.recv[request.request_id] = RecvJob(str(params["transfer_id"]), address,
                                                             str(params.get("remote_engine_id", "")), [],
                                                             remote_tp_size=_remote_tp_size(params))
            params["do_remote_prefill"] = False
            return False, None
        if not params.get("do_remote_decode") or not self.is_producer:
            return False, None
        transfer_id = str(params.get("transfer_id") or f"xfer-{request.request_id}")
        if not _finished_normally(request):
            self._step.dropped_transfers.add(transfer_id)
            return False, None
        groups = [list(ids) for ids in block_ids]
        if not any(groups):
            return False, None
        self._step.send[request.request_id] = SendJob(transfer_id, groups)
        host = self.options.side_channel_host
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_bootstrap_addr": f"{host}:{self.port}",
            "remote_host": host,
            "remote_port": self.port,
            "remote_tp_size": self.tp_size,
            # Side-channel ports from remote_port on, one per prefill worker: where a router sends a release.
            "remote_workers": self.workers,
            "transfer_id": transfer_id,
            "remote_block_ids": groups[0],
        }

    def build_step(self) -> P2PStep:
        step, self._step = self._step, P2PStep()
        return step


def _remote_tp_size(params: dict[str, Any]) -> int | None:
    value = params.get("remote_tp_size")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        # A client's bad value must not stop the engine: pair rank to rank (the handshake then names a mismatch).
        logger.warning("ignoring kv_transfer_params['remote_tp_size']=%r (not a positive int)", value)
        return None
    return value


def _finished_normally(request: Any) -> bool:
    """Only a prefill that ran to its token budget or a stop leaves KV worth handing over (not aborted/errored)."""
    return getattr(request.status, "name", "") in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
