"""`ascend-vllm router --prefill URL … --decode URL …`: the OpenAI-compatible front of disaggregated serving.

The implementation is `ascend_vllm.router`; this module only turns the command line into a `RouterConfig`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

HELP = ("Route OpenAI completions/chat requests through prefill servers to decode servers "
        "(disaggregated prefill with AscendMooncakeConnector's kv_transfer_params).")

EPILOG = """\
Start the servers with `ascend-vllm serve` and an AscendMooncakeConnector --kv-transfer-config
(kv_role kv_producer on prefill servers, kv_consumer on decode servers), then e.g.
  ascend-vllm router --prefill http://10.0.0.1:8100 --decode http://10.0.0.2:8200 --decode http://10.0.0.3:8200
Clients talk to the router as to one vLLM server (POST /v1/completions, /v1/chat/completions, streamed or not).
GET /health is 200 while each role has a healthy server; GET /status shows every server's state and load.
Errors: 502 (504 on a timeout) naming the failing server; 503 when a role has no healthy server or the queue is
full; an upstream 4xx is returned as is. A stream that fails after it started ends with an error event.
When a decode leg fails before it read the KV, the router releases the prefill's held blocks over the prefill's
side channel (so they do not wait out its abort timeout) and says so in the error."""

_HELP = {
    "connect_timeout_s": "bound on opening a connection to a server",
    "prefill_timeout_s": "bound on a whole prefill request",
    "decode_timeout_s": "bound on a whole decode answer, streamed or not",
    "read_timeout_s": "longest wait for the next bytes of a decode answer (a non-streamed one: all of it)",
    "health_interval_s": "seconds between health checks (GET /health) of every server",
    "health_timeout_s": "bound on one health check",
    "max_inflight": "requests proxied at once",
    "max_queued": "requests allowed to wait for a slot beyond --max-inflight (more: 503 at once)",
    "queue_timeout_s": "longest wait for a slot (then 503)",
    "keepalive_s": "idle upstream connections are closed after this (keep it below the servers' keep-alive)",
    "release_timeout_s": "bound on releasing a prefill's held KV over its side channel after the decode leg failed",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ascend_vllm.router.config import RouterConfig, option_name

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--prefill", action="append", required=True, metavar="URL",
                        help="a prefill server's base URL, e.g. http://127.0.0.1:8100 (repeat for several)")
    parser.add_argument("--decode", action="append", required=True, metavar="URL",
                        help="a decode server's base URL (repeat for several)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this host only)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    for f in fields(RouterConfig):
        if f.name in _HELP:
            kind = int if f.name.startswith("max_") else float
            parser.add_argument(option_name(f.name), dest=f.name, type=kind, default=f.default,
                                metavar="N" if kind is int else "SECONDS",
                                help=f"{_HELP[f.name]} (default {f.default:g})")
    parser.add_argument("--side-channel-secret-file", default="", metavar="FILE",
                        help="the file holding the secret the engines' side channels were given "
                        "(kv_connector_extra_config side_channel_secret_file): needed to release a prefill's KV "
                        "when they have one")


def run(args: argparse.Namespace) -> int:
    from ascend_vllm.router.config import RouterConfig, RouterConfigError

    try:
        config = RouterConfig(prefill=tuple(args.prefill), decode=tuple(args.decode), host=args.host,
                              port=args.port, side_channel_secret_file=args.side_channel_secret_file,
                              **{name: getattr(args, name) for name in _HELP})
    except RouterConfigError as exc:
        print(f"ascend-vllm router: {exc}", file=sys.stderr)
        return 2
    try:
        from ascend_vllm.router.runner import serve
    except ImportError as exc:
        print(f"ascend-vllm router: {exc.name or exc} is missing; install the router extra: "
              "pip install \"ascend-vllm[router]\"", file=sys.stderr)
        return 2
    serve(config, log_level=args.log_level)
    return 0
