"""Serve the router with uvicorn (the server vLLM's own API server runs on)."""

from __future__ import annotations

import logging

import uvicorn

from ascend_vllm.router.app import create_app
from ascend_vllm.router.config import RouterConfig

GRACEFUL_SHUTDOWN_S = 10.0


def serve(config: RouterConfig, log_level: str = "info") -> None:
    """Run until SIGINT/SIGTERM; requests in flight then get up to `GRACEFUL_SHUTDOWN_S` to finish."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=log_level, access_log=False,
                lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
