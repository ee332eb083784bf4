"""Start an engine host process and call it; every wait is bounded and the process is always reaped."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ascend_testkit.netns import LoopbackNamespace


class EngineHostError(RuntimeError):
    pass


def engine_env(cache_root: str | os.PathLike, cpu: int | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment an engine host needs here: offline, small KV space, own cache, pinned to one core."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               VLLM_CACHE_ROOT=str(cache_root), VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    if cpu is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu)
    env.update(extra or {})
    return env


class EngineProcess:
    def __init__(self, config: dict[str, Any], *, env: dict[str, str], log_path: str | os.PathLike,
                 netns: LoopbackNamespace | None = None, argv: list[str] | None = None, start_timeout: float = 400.0,
                 wait: bool = True):
        argv = argv or [sys.executable, "-m", "ascend_kv_transfer.engine_harness.host"]
        argv = [*argv, json.dumps(config)]
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        cmd = netns.command(argv) if netns is not None else argv
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env)
        self.pid: int | None = None
        self._start_timeout = start_timeout
        if wait:
            self.wait_ready()

    def wait_ready(self) -> EngineProcess:
        """Block until the engine is up (start several hosts first, then wait, to overlap their start-up)."""
        if self.pid is not None:
            return self
        try:
            hello = self._read(self._start_timeout, "start")
        except EngineHostError:
            self.close()
            raise
        if not hello.get("ready"):
            self.close()
            raise EngineHostError(f"engine host failed to start: {hello.get('error')} (log: {self.log_path})")
        self.pid = hello["pid"]
        return self

    def _read(self, timeout: float, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineHostError(f"engine host gave no answer to {what} within {timeout} s (log: {self.log_path})")
            readable, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if readable:
                line = self.proc.stdout.readline()
                if not line:
                    raise EngineHostError(f"engine host exited ({self.proc.poll()}) during {what}; "
                                          f"log tail:\n{self.log_tail()}")
                return json.loads(line)
            if self.proc.poll() is not None:
                raise EngineHostError(f"engine host exited ({self.proc.returncode}) during {what}; "
                                      f"log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def call(self, op: str, wait: float = 180.0, **kwargs: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, **kwargs}) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._read(wait, op)
        if not reply.get("ok"):
            raise EngineHostError(f"{op} failed in the engine host: {reply.get('error')}")
        return reply["result"]

    def generate(self, requests: list[dict[str, Any]], timeout: float = 120.0) -> list[dict[str, Any]]:
        return self.call("generate", wait=timeout + 10, requests=requests, timeout=timeout)

    def submit(self, requests: list[dict[str, Any]]) -> list[str]:
        return self.call("submit", requests=requests)

    def collect(self, ids: list[str], timeout: float = 120.0) -> list[dict[str, Any]]:
        return self.call("collect", wait=timeout + 10, ids=ids, timeout=timeout)

    def kill(self) -> None:
        """Kill the host hard (fault injection)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self, timeout: float = 20.0) -> None:
        if self.pid is None:
            self.kill()
        if self.proc.poll() is None:
            try:
                self.call("shutdown", wait=timeout)
                self.proc.wait(timeout=timeout)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
