"""One disaggregated request: prefill on one server, decode on another, the decode answer relayed as it comes.

The kv_transfer_params convention is `AscendMooncakeConnector`'s (and vLLM's own disaggregation proxies'): the
prefill request carries `{"do_remote_decode": true, "transfer_id": ...}` with `max_tokens=1`, non-streamed; the
params its response returns go on the decode request unchanged. A prefill that returns no params (a server without a
`kv_producer` connector, or a first token that ended the answer) makes the decode server compute the prompt itself.

Failures: a server that refuses the connection never saw the request, so it is taken out and the next server of
its role is tried; any other failure answers 502 (504 for a timeout) naming the server, and asks the health checker
to look at it now. An upstream's 4xx (the request's own fault) is returned unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp

from ascend_vllm.router.config import RouterConfig
from ascend_vllm.router.errors import PassThrough, RouterError, sse_error
from ascend_vllm.router.health import HealthChecker, describe
from ascend_vllm.router.pool import Lease, ServerPool

logger = logging.getLogger(__name__)

_JSON = "application/json"
_LAST_EVENT = b"data: [DONE]"  # how vLLM's OpenAI server ends a stream
RELEASE_THREADS = 4


def prefill_payload(body: dict, transfer_id: str) -> dict:
    """The request as the prefill server gets it: one token, not streamed, asking to hold the KV for a decode."""
    payload = dict(body)
    payload["max_tokens"] = 1
    if "max_completion_tokens" in payload:
        payload["max_completion_tokens"] = 1
    payload["stream"] = False
    for key in ("stream_options", "min_tokens"):
        payload.pop(key, None)
    payload["kv_transfer_params"] = {"do_remote_decode": True, "transfer_id": transfer_id}
    return payload


def decode_payload(body: dict, kv_transfer_params: dict | None) -> dict:
    payload = dict(body)
    if kv_transfer_params:
        payload["kv_transfer_params"] = kv_transfer_params
    else:
        payload.pop("kv_transfer_params", None)
    return payload


def _snippet(raw: bytes, limit: int = 300) -> str:
    text = raw[:limit].decode(errors="replace").strip()
    return text + (" …" if len(raw) > limit else "")


class DisaggregatedProxy:
    def __init__(self, config: RouterConfig, session: aiohttp.ClientSession, prefill: ServerPool,
                 decode: ServerPool, health: HealthChecker):
        self.config = config
        self.session = session
        self.prefill_pool = prefill
        self.decode_pool = decode
        self.health = health
        self._prefill_timeout = aiohttp.ClientTimeout(total=config.prefill_timeout_s,
                                                      connect=config.connect_timeout_s)
        self._decode_timeout = aiohttp.ClientTimeout(total=config.decode_timeout_s, connect=config.connect_timeout_s,
                                                     sock_read=config.read_timeout_s)
        self._warned_no_params: set[str] = set()
        self._auth = None
        if config.side_channel_secret_file:
            from ascend_kv_transfer.p2p.side_channel_auth import SideChannelAuth

            self._auth = SideChannelAuth.from_file(config.side_channel_secret_file)
        self.releases: dict[str, int] = {"released": 0, "kept": 0, "failed": 0}
        # Releases block on side-channel round trips: a small pool of their own, so a storm of failing decode legs
        # neither waits on nor grows the event loop's default executor.
        self._release_pool = ThreadPoolExecutor(max_workers=RELEASE_THREADS, thread_name_prefix="router-kv-release")

    async def release_prefill(self, params: dict | None, reason: str) -> str:
        """The decode leg failed: free the prefill's held KV blocks now rather than at its abort timeout (a transfer
        a decode already claimed is left to it). Returns what happened, for the error message; "" when nothing was
        held (no params)."""
        from ascend_kv_transfer.p2p.release import release_targets, release_transfer

        try:
            if not params or not release_targets(params):
                return ""
            outcomes = await asyncio.get_running_loop().run_in_executor(
                self._release_pool, functools.partial(release_transfer, params, reason=reason,
                                                      timeout_s=self.config.release_timeout_s, auth=self._auth))
        except ValueError as exc:  # params the router cannot read: say so, the prefill frees at its timeout
            self.releases["failed"] += 1
            return f"the prefill's KV was not released ({exc})"
        for outcome in outcomes.values():
            self.releases["released" if outcome == "released" else "kept" if outcome.startswith("kept")
                          else "failed"] += 1
        if all(o == "released" for o in outcomes.values()):
            return "the prefill's KV blocks were released"
        failed = {w: o for w, o in outcomes.items() if o != "released"}
        logger.warning("release of transfer %s: %s", params.get("transfer_id"), failed)
        return "the prefill's KV release: " + "; ".join(f"{w} {o}" for w, o in outcomes.items())

    def close(self) -> None:
        self._release_pool.shutdown(wait=False, cancel_futures=True)

    def _failed(self, pool: ServerPool, lease: Lease, reason: str, *, take_out: bool) -> None:
        lease.release(ok=False)
        if take_out:
            pool.set_health(lease.upstream, False, reason)
        self.health.check_soon(pool, lease.upstream)

    def _lease(self, pool: ServerPool, tried: dict[str, str]) -> Lease:
        lease = pool.lease(exclude=set(tried))
        if lease is not None:
            return lease
        if tried:
            failures = "; ".join(f"{url}: {why}" for url, why in tried.items())
            raise RouterError(502, f"{pool.role} failed on every server tried ({failures})", next(iter(tried)),
                              pool.role)
        raise RouterError(503, pool.unavailable_reason())

    async def _open(self, pool: ServerPool, path: str, data: bytes, headers: dict, timeout: aiohttp.ClientTimeout,
                    waited_s: float) -> tuple[Lease, aiohttp.ClientResponse]:
        """Send to the servers of `pool` in turn (module docstring: a refused connection tries the next one, any
        other failure ends the request). Returns the lease and a status-200 response whose body is not read yet."""
        role, tried = pool.role, {}
        while True:
            lease = self._lease(pool, tried)
            url = lease.upstream.url
            try:
                resp = await self.session.post(url + path, data=data, headers=headers, timeout=timeout)
            except aiohttp.ClientConnectorError as exc:
                tried[url] = f"connection failed ({describe(exc)})"
                self._failed(pool, lease, tried[url], take_out=True)
                continue
            except asyncio.TimeoutError:
                self._failed(pool, lease, "timeout", take_out=False)
                raise RouterError(504, f"{role} server {url} sent no answer within {waited_s:g} s", url,
                                  role) from None
            except aiohttp.ClientError as exc:
                self._failed(pool, lease, describe(exc), take_out=True)
                raise RouterError(502, f"{role} server {url} failed: {describe(exc)}", url, role) from None
            if resp.status == 200:
                return lease, resp
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                raw = b""
            finally:
                resp.release()
            lease.release(ok=False)
            if 400 <= resp.status < 500:
                raise PassThrough(resp.status, raw, resp.content_type, url, role)
            raise RouterError(502, f"{role} server {url} answered {resp.status}: {_snippet(raw)}", url, role)

    async def _read(self, pool: ServerPool, lease: Lease, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body of a response `_open` returned; the lease is released either way."""
        url, role = lease.upstream.url, pool.role
        try:
            raw = await resp.read()
        except asyncio.TimeoutError:
            resp.close()
            self._failed(pool, lease, "timeout", take_out=False)
            raise RouterError(504, f"{role} server {url} did not finish within its timeout", url, role) from None
        except aiohttp.ClientError as exc:
            resp.close()
            self._failed(pool, lease, describe(exc), take_out=True)
            raise RouterError(502, f"{role} server {url} failed: {describe(exc)}", url, role) from None
        resp.release()
        lease.release(ok=True)
        return raw

    async def prefill(self, path: str, body: dict, headers: dict, transfer_id: str) -> tuple[str, dict | None]:
        """Run the prefill leg; returns the prefill server's URL and the kv_transfer_params its answer carries."""
        if not self.decode_pool.healthy():  # no prefill (and KV held for nobody) when no decode server can follow
            raise RouterError(503, self.decode_pool.unavailable_reason())
        data = json.dumps(prefill_payload(body, transfer_id)).encode()
        lease, resp = await self._open(self.prefill_pool, path, data, headers, self._prefill_timeout,
                                       self.config.prefill_timeout_s)
        url = lease.upstream.url
        raw = await self._read(self.prefill_pool, lease, resp)
        try:
            params = json.loads(raw).get("kv_transfer_params")
        except (ValueError, AttributeError):
            raise RouterError(502, f"prefill server {url} answered 200 without a JSON object: "
                                   f"{_snippet(raw)}", url, "prefill") from None
        if not params and url not in self._warned_no_params:
            self._warned_no_params.add(url)
            logger.warning("prefill server %s returned no kv_transfer_params (is it started with a kv_producer "
                           "--kv-transfer-config?); decode servers will compute such prompts themselves", url)
        return url, params or None

    async def open_decode(self, path: str, body: dict, headers: dict) -> tuple[Lease, aiohttp.ClientResponse]:
        """Send the decode request; returns its lease and the response, status 200, body not read yet."""
        return await self._open(self.decode_pool, path, json.dumps(body).encode(), headers, self._decode_timeout,
                                self.config.read_timeout_s)

    async def read_all(self, lease: Lease, resp: aiohttp.ClientResponse) -> bytes:
        """The whole (non-streamed) decode answer."""
        return await self._read(self.decode_pool, lease, resp)

    async def relay(self, lease: Lease, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The decode server's stream, chunk by chunk as it arrives; a failure mid-stream ends it with an error
        event (the 200 headers are already sent). Closing the generator early closes the upstream connection, so
        the decode server aborts the request."""
        url = lease.upstream.url
        ok = False
        tail = b""  # the stream's last bytes relayed: whether its final event went out
        try:
            async for chunk in resp.content.iter_any():
                tail = (tail + chunk)[-len(_LAST_EVENT) - 8:]
                yield chunk
            ok = True
        except asyncio.TimeoutError:
            self._failed(self.decode_pool, lease, "timeout", take_out=False)
            yield sse_error(504, f"decode server {url} sent nothing for {self.config.read_timeout_s:g} s "
                                 "(or passed the whole-answer bound)")
        except aiohttp.ClientError as exc:
            self._failed(self.decode_pool, lease, describe(exc), take_out=True)
            yield sse_error(502, f"decode server {url} failed mid-stream: {describe(exc)}")
        finally:
            if ok:
                resp.release()
            else:
                resp.close()
            # A client may close as soon as it read the final event, before the upstream body's end reached us
            # (the generator is then closed at its `yield`): the whole answer went out, so the lease ended well.
            lease.release(ok=ok or tail.rstrip().endswith(_LAST_EVENT))
