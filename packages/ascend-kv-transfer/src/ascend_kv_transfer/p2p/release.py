"""Giving a held transfer up from outside the engines: what a router does when a request's decode leg fails.

The prefill's output `kv_transfer_params` say where its workers' side channels are (`remote_bootstrap_addr` or
`remote_host`/`remote_port`, and `remote_workers` ports from it) and which transfer holds the blocks
(`transfer_id`). `release_transfer` sends each worker a `ReleaseRequest`, so the blocks of a transfer no decode
claimed are free at once instead of at the prefill's `abort_timeout_s`.
"""

from __future__ import annotations

from typing import Any

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.scheduler_side import parse_address
from ascend_kv_transfer.p2p.side_channel import SideChannelClient
from ascend_kv_transfer.p2p.side_channel_auth import SideChannelAuth


def release_targets(params: dict[str, Any]) -> list[tuple[str, int]]:
    """The side-channel addresses of every prefill worker holding the transfer; [] when params name none."""
    address = parse_address(params)
    if not params.get("do_remote_prefill") or not params.get("transfer_id") or address is None:
        return []
    workers = params.get("remote_workers") or params.get("remote_tp_size") or 1
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"kv_transfer_params['remote_workers']={workers!r}: expected a positive int")
    return [(address[0], address[1] + i) for i in range(workers)]


def release_transfer(params: dict[str, Any], *, reason: str, timeout_s: float,
                     auth: SideChannelAuth | None = None) -> dict[str, str]:
    """Release the transfer the params name on every prefill worker (blocking, each round trip bounded by
    `timeout_s`). Returns worker address -> outcome: "released", "kept (claimed)" (a decode is reading it: its
    readers free it), or what went wrong (a worker gone or silent frees the blocks at its own abort timeout)."""
    outcomes: dict[str, str] = {}
    client = SideChannelClient(timeout_s, auth=auth)
    message = schema.ReleaseRequest(transfer_id=str(params.get("transfer_id", "")), reason=reason)
    try:
        for address in release_targets(params):
            where = f"tcp://{address[0]}:{address[1]}"
            try:
                reply = client.request(address, message)
            except Exception as e:
                outcomes[where] = f"not released: {e}"
                continue
            if not isinstance(reply, schema.ReleaseResponse):
                outcomes[where] = f"not released: answered {type(reply).__name__}"
            else:
                outcomes[where] = "released" if reply.released else f"kept ({reply.reason})"
    finally:
        client.close()
    return outcomes
