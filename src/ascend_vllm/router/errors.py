"""The router's HTTP errors, in the OpenAI error shape clients already parse (`{"error": {"message", ...}}`)."""

from __future__ import annotations

import json

_TYPES = {400: "BadRequestError", 502: "BadGatewayError", 503: "ServiceUnavailableError",
          504: "GatewayTimeoutError"}


class RouterError(Exception):
    """A request the router answers itself: `status` and a message that names the server involved, if any."""

    def __init__(self, status: int, message: str, server: str | None = None, role: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.server = server
        self.role = role  # "prefill" or "decode": the role `server` had in this request

    def body(self) -> dict:
        return error_body(self.status, self.message)


class PassThrough(Exception):  # noqa: N818 - a reply, not an error of the router
    """An upstream's own client-error reply (4xx: the request is at fault, not the server), returned unchanged."""

    def __init__(self, status: int, body: bytes, content_type: str, server: str, role: str):
        super().__init__(f"{role} server {server} answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type
        self.server = server
        self.role = role


def error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "RouterError"), "param": None, "code": status}}


def sse_error(status: int, message: str) -> bytes:
    """An error event for a stream whose 200 headers are already sent (the openai client raises on it)."""
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"
