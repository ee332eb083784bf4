"""`EngineHost`: start an engine host process and call it; every wait is bounded and the process is always reaped.

Commands can be sent without waiting (`send`) and their replies read later (`receive`), so several hosts start
their engines at the same time; `call` does both.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ascend_testkit.engine.env import engine_env, vllm_cache_root
from ascend_testkit.reach.collect import reach_env

HELLO_TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 300.0
SAVE_REACH_TIMEOUT_S = 30.0


class EngineError(RuntimeError):
    """A host command failed, or the host died or went silent."""

    def __init__(self, message: str, error: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error = dict(error or {})
        self.type = self.error.get("type")


class EngineStartError(EngineError):
    """The engine refused to start (the message is vLLM's or our platform's, e.g. a bad additional_config)."""


def _make_room(host: EngineHost) -> None:
    """Before an engine starts (or a retired host comes back): idle hosts give memory back if it is short."""
    from ascend_testkit.engine.pool import make_room  # the pool module builds on this one

    make_room(keep=host)


class EngineHost:
    def __init__(self, name: str, *, lane: str = "simulated", log_dir: str | os.PathLike, cpus: str | int | None = None,
                 runner: str | None = None, env: Mapping[str, str] | None = None, netns: Any = None,
                 setup: Sequence[str] = ()) -> None:
        self.name = name
        self.lane = lane
        self.runner = runner
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        argv = [sys.executable, "-m", "ascend_testkit.engine.host", *(a for s in setup for a in ("--setup", s))]
        self._cmd = netns.command(argv) if netns is not None else argv
        cache_root = vllm_cache_root(log_dir / f"{name}-vllm-cache")
        self._env = engine_env(lane, cache_root, cpus=cpus, runner=runner, extra=env)
        self.retired = False
        self.last_used = time.monotonic()
        self.spawns = 0
        self._spawn()

    def _spawn(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(self._cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=self._env)
        self._waiting: deque[tuple[str, float]] = deque([("hello", HELLO_TIMEOUT_S)])
        self._buffer = b""
        self.pid: int | None = None
        self.engine: dict[str, Any] | None = None
        self.retired = False
        self.spawns += 1

    @property
    def idle(self) -> bool:
        """Running, with no engine and no command under way: closing it loses nothing but its warm imports."""
        return self.alive and self.engine is None and all(op == "hello" for op, _ in self._waiting)

    def retire(self) -> None:
        """End an idle host's process to give its memory back; the next command starts a fresh one, which costs
        the vLLM import again (`engine.pool.make_room` retires stale idle hosts past a few or on short memory)."""
        if not self.idle:
            raise EngineError(f"engine host {self.name} is not idle (engine {self.engine}, waiting "
                              f"{[op for op, _ in self._waiting]}): it cannot be retired")
        self.close()
        self.retired = True

    # ---- the pipe -------------------------------------------------------------------------------------------------
    def send(self, op: str, wait_s: float = CALL_TIMEOUT_S, **kwargs: Any) -> EngineHost:
        """Send a command without waiting for its reply (read it with `receive`, within `wait_s`)."""
        if self.retired:
            _make_room(self)
            self._spawn()
        self.last_used = time.monotonic()
        if self.proc.poll() is not None:
            raise EngineError(f"engine host {self.name} has exited ({self.proc.returncode}); log tail:\n"
                              f"{self.log_tail()}")
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, **kwargs}) + "\n").encode())
        self.proc.stdin.flush()
        self._waiting.append((op, wait_s))
        return self

    def receive(self) -> Any:
        """The reply to the oldest command sent; raises EngineError when it failed or did not come in time."""
        while self._waiting and self._waiting[0][0] == "hello":
            self._waiting.popleft()
            self.pid = self._read_line(HELLO_TIMEOUT_S, "hello")["result"]["pid"]
        if not self._waiting:
            raise EngineError(f"engine host {self.name}: no command is waiting for a reply")
        op, timeout = self._waiting.popleft()
        reply = self._read_line(timeout, op)
        if not reply.get("ok"):
            err = reply.get("error") or {}
            cls = EngineStartError if op == "start" else EngineError
            raise cls(f"{op} failed in engine host {self.name}: {err.get('type')}: {err.get('message')}\n"
                      f"{err.get('traceback', '')}", err)
        return reply["result"]

    def call(self, op: str, wait_s: float = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
        while any(w[0] != "hello" for w in self._waiting):
            self.receive()  # replies come in order: take what an earlier `send` left first
        return self.send(op, wait_s, **kwargs).receive()

    def _read_line(self, timeout: float, what: str) -> dict[str, Any]:
        # Raw reads into our own buffer: a buffered reader could swallow two replies in one read, and `select` on
        # the pipe would then wait for a second reply that already came.
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(f"engine host {self.name} gave no answer to {what} within {timeout:.0f} s "
                                  f"(log: {self.log_path})")
            readable, _, _ = select.select([fd], [], [], min(left, 1.0))
            if readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EngineError(f"engine host {self.name} exited ({self.proc.wait(timeout=30)}) during "
                                      f"{what}; log tail:\n{self.log_tail()}")
                self._buffer += chunk
            elif self.proc.poll() is not None:
                raise EngineError(f"engine host {self.name} exited ({self.proc.returncode}) during {what}; "
                                  f"log tail:\n{self.log_tail()}")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # ---- engine life cycle ----------------------------------------------------------------------------------------
    def start(self, model: str | os.PathLike, *, env: Mapping[str, str] | None = None, wait: bool = True,
              timeout: float = START_TIMEOUT_S, **engine: Any) -> Any:
        """Build `LLM(model, **engine)` in the host, after setting `env` (per-engine variables).

        The model runner is the host's (`EngineHost(runner=...)`). With `wait=False` the command is only sent: call
        `started()` later (to overlap several hosts' start-ups).
        """
        if "runner" in engine:
            raise TypeError("the model runner is chosen per host process: EngineHost(..., runner='v1'|'v2')")
        if not self.retired:
            _make_room(self)
        self.send("start", timeout, model=str(model), engine=engine, env=dict(env or {}))
        return self.started() if wait else self

    def started(self) -> dict[str, Any]:
        self.engine = self.receive()
        return self.engine

    def start_error(self, model: str | os.PathLike, **kwargs: Any) -> dict[str, Any] | None:
        """Try to start an engine that should be refused: its error ({type, message}), or None if it started."""
        try:
            self.start(model, **kwargs)
        except EngineStartError as exc:
            return {"type": exc.error.get("type"), "message": exc.error.get("message")}
        self.stop()
        return None

    def stop(self) -> None:
        self.call("stop")
        self.engine = None

    # ---- generation -----------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str] | None = None, *, prompt_token_ids: Sequence[Sequence[int]] | None = None,
                 sequential: bool = False, timeout: float = CALL_TIMEOUT_S, lora: Any = None,
                 **sampling: Any) -> dict[str, Any]:
        """`LLM.generate` (greedy unless told otherwise): {"outputs": [{token_ids, text, logprobs, ...}], "seconds"}.
        `lora`: the adapter of every request ({name, id, path}), or a list of those (None: the base model) with one
        entry per request (the engine needs `enable_lora=True`)."""
        return self.call("generate", timeout, prompts=list(prompts) if prompts is not None else None,
                         prompt_token_ids=[list(p) for p in prompt_token_ids] if prompt_token_ids is not None
                         else None, sampling=sampling, sequential=sequential, lora=lora)

    def embed(self, prompts: Sequence[str], *, timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        """`LLM.embed` on a pooling engine: {"embeddings": [[float], ...] in prompt order, "seconds"}."""
        return self.call("embed", timeout, prompts=list(prompts))

    @staticmethod
    def _request(r: Mapping[str, Any]) -> dict[str, Any]:
        """{id, prompt_token_ids | prompt, max_tokens, kv_transfer_params, sampling} -> the host's request form."""
        sampling = {"max_tokens": r.get("max_tokens", 8), "ignore_eos": True, **r.get("sampling", {})}
        if r.get("kv_transfer_params"):
            sampling["kv_transfer_params"] = r["kv_transfer_params"]
        out = {"id": r["id"], "sampling": sampling}
        out.update({k: r[k] for k in ("prompt", "prompt_token_ids") if k in r})
        return out

    def submit(self, requests: Sequence[Mapping[str, Any]]) -> list[str]:
        """Add requests without waiting; the host keeps stepping the engine. Timings come back from `collect`."""
        return self.call("submit", requests=[self._request(r) for r in requests])

    def progress(self, ids: Sequence[str]) -> dict[str, int]:
        """Output tokens so far of submitted requests (the host steps between commands)."""
        return self.call("progress", ids=list(ids))

    def collect(self, ids: Sequence[str], timeout: float = 120.0) -> list[dict[str, Any]]:
        return self.call("collect", timeout + 10, ids=list(ids), timeout=timeout)

    def run_requests(self, requests: Sequence[Mapping[str, Any]], timeout: float = 120.0) -> list[dict[str, Any]]:
        """`submit` then `collect`: each request's outputs with t_add / t_first / t_end / t_landed (epoch s)."""
        return self.collect(self.submit(requests), timeout)

    # ---- what ran, and the engine's state -------------------------------------------------------------------------
    def usage(self) -> list[dict[str, Any]]:
        return self.call("usage")

    def rpc(self, function: str, *args: Any) -> list[Any]:
        return self.call("rpc", function=function, args=list(args))

    def sleep(self, level: int = 1) -> None:
        self.call("sleep", level=level)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        self.call("wake_up", tags=list(tags) if tags else None)

    def reset_prefix_cache(self) -> bool:
        return self.call("reset_prefix_cache")

    def free_blocks(self) -> int:
        return self.call("free_blocks")

    def total_blocks(self) -> int:
        return self.call("total_blocks")

    def stats(self) -> dict[str, Any]:
        return self.call("stats")

    def metrics_mark(self) -> None:
        self.call("metrics_mark")

    def acceptance(self, k: int | None = None) -> dict[str, Any]:
        return self.call("acceptance", k=k)

    def engine_steps(self) -> int:
        return self.call("engine_steps")

    # ---- the process ----------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the host hard (fault injection); its engine dies with it. A host recording reach writes what it ran
        first (the measurement is not part of the fault; a shared host may have served other suites before)."""
        if self.proc.poll() is None and reach_env() and not self._waiting:
            with contextlib.suppress(EngineError, OSError):
                self.call("save_reach", SAVE_REACH_TIMEOUT_S)
        self._terminate()

    def _terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def close(self, timeout: float = 60.0) -> None:
        """Stop the engine and end the process (killed if it does not end in time)."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.close()  # EOF ends the host's loop too, should it be busy replying
                self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._terminate()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> EngineHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
