"""`ascend-vllm router`: an OpenAI-compatible front for disaggregated prefill/decode serving.

Each completion or chat completion goes to a prefill server (`max_tokens=1`, `kv_transfer_params` asking it to hold
the KV), then to a decode server with the params the prefill returned; the decode server's answer is streamed back.
Several servers per role (least outstanding requests), health checks, bounded timeouts and queues, and HTTP errors
that name the failing server. Modules: `config` (settings), `pool` (servers, load, choice), `health` (checks),
`admission` (bounded queue), `proxy` (the two-step request), `app` (routes), `runner` (uvicorn).

Needs the `router` extra (`pip install "ascend-vllm[router]"`: starlette, uvicorn, aiohttp); imports nothing from
vLLM, so it can run on a host without it.
"""

from ascend_vllm.router.config import RouterConfig, RouterConfigError

__all__ = ["RouterConfig", "RouterConfigError"]
