"""An engine host process: one in-process vLLM `LLMEngine`, driven by JSON-line commands on stdin.

The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the host can read what a test needs
to assert on — the scheduler's free block count, the connectors' own counters — and keeps stepping the engine while
it has work (held blocks waiting for DONE or a timeout) even between commands. Replies go to the original stdout;
vLLM's logs are sent to stderr.

Usage: `python -m ascend_kv_transfer.engine_harness.host '<json config>'`.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import Any


def _rpc_stream():
    fd = os.dup(1)
    os.dup2(2, 1)  # anything printed (vLLM logs to stdout) lands on stderr
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


class EngineHost:
    def __init__(self, config: dict[str, Any]):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import EngineArgs
        from vllm.config import KVTransferConfig
        from vllm.v1.engine.llm_engine import LLMEngine

        kv = config.get("kv_transfer_config")
        args = EngineArgs(
            model=config["model"], dtype="float32", enforce_eager=True, seed=0,
            max_model_len=config.get("max_model_len", 1024), max_num_seqs=config.get("max_num_seqs", 4),
            block_size=config.get("block_size", 128),
            enable_prefix_caching=config.get("enable_prefix_caching", True),
            kv_transfer_config=KVTransferConfig(**kv) if kv else None,
        )
        self.engine = LLMEngine.from_engine_args(args)
        self.core = self.engine.engine_core.engine_core
        self.transfer_times: dict[str, float] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        self.done: dict[str, dict[str, Any]] = {}
        self._probe_transfer_results()

    def _worker_connector(self):
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        return get_kv_transfer_group() if has_kv_transfer_group() else None

    def _probe_transfer_results(self) -> None:
        """Note when each request's KV is reported landed (the same probe for every connector)."""
        connector = self._worker_connector()
        if connector is None:
            return
        inner = connector.get_transfer_results

        def probed(finished_req_ids):
            results = inner(finished_req_ids)
            now = time.time()
            for req_id in results.finished_recving:
                self.transfer_times.setdefault(req_id, now)
            return results

        connector.get_transfer_results = probed

    # ---- commands -----------------------------------------------------------------------------------------------
    def submit(self, requests: list[dict[str, Any]]) -> list[str]:
        """Add requests without waiting (the host keeps stepping); `collect` their outputs later."""
        from vllm import SamplingParams

        for r in requests:
            params = SamplingParams(temperature=0.0, max_tokens=r.get("max_tokens", 8), ignore_eos=True,
                                    extra_args={"kv_transfer_params": r["kv_transfer_params"]}
                                    if r.get("kv_transfer_params") else None)
            self.pending[r["id"]] = {"id": r["id"], "t_add": time.time()}
            self.engine.add_request(r["id"], {"prompt_token_ids": r["prompt_token_ids"]}, params)
        return [r["id"] for r in requests]

    def collect(self, ids: list[str], timeout: float = 120.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while any(i not in self.done for i in ids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests {[i for i in ids if i not in self.done]} not finished within {timeout} s")
            self.step_once()
        out = [self.done.pop(i) for i in ids]
        for rec in out:
            rec["t_landed"] = self._landed_at(rec["id"])
        return out

    def generate(self, requests: list[dict[str, Any]], timeout: float = 120.0) -> list[dict[str, Any]]:
        return self.collect(self.submit(requests), timeout)

    def step_once(self) -> None:
        for out in self.engine.step():
            rec = self.pending.get(out.request_id)
            if rec is None:
                continue
            rec.setdefault("t_first", time.time())
            if out.finished:
                rec.update(t_end=time.time(), token_ids=list(out.outputs[0].token_ids),
                           kv_transfer_params=out.kv_transfer_params, num_cached_tokens=out.num_cached_tokens,
                           finish_reason=out.outputs[0].finish_reason)
                self.done[out.request_id] = self.pending.pop(out.request_id)

    def _landed_at(self, request_id: str) -> float | None:
        for key, t in self.transfer_times.items():
            if key == request_id or key.startswith(request_id):
                return t
        return None

    def free_blocks(self) -> int:
        return int(self.core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        scheduler_conn = getattr(self.core.scheduler, "connector", None)
        worker_conn = self._worker_connector()
        for name, conn in (("scheduler", scheduler_conn), ("worker", worker_conn)):
            if conn is not None and hasattr(conn, "connector_stats"):
                out[name] = conn.connector_stats()
        out["free_blocks"] = self.free_blocks()
        return out

    def step_idle(self) -> None:
        if self.core.scheduler.has_requests():
            self.step_once()

    def reset_prefix_cache(self) -> bool:
        return bool(self.engine.reset_prefix_cache())

    def shutdown(self) -> None:
        connector = self._worker_connector()
        if connector is not None:
            connector.shutdown()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = _rpc_stream()
    config = json.loads(argv[0])
    try:
        host = EngineHost(config)
    except Exception as e:
        out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        raise
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    stdin = sys.stdin
    while True:
        busy = host.core.scheduler.has_requests()
        readable, _, _ = select.select([stdin], [], [], 0 if busy else 0.5)
        if not readable:
            host.step_idle()
            continue
        line = stdin.readline()
        if not line:
            break
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "shutdown":
                host.shutdown()
                out.write(json.dumps({"ok": True, "result": None}) + "\n")
                break
            result = getattr(host, op)(**cmd)
            out.write(json.dumps({"ok": True, "result": result}, default=str) + "\n")
        except Exception as e:
            out.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
