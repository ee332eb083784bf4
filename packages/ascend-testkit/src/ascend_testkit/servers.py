"""HTTP servers as users run them, for tests, the serving demo and the serving benchmark.

`start_serve` starts `ascend-vllm serve` (vLLM's OpenAI-compatible server on our platform) and `start_router` starts
`ascend-vllm router`, each as a child process in its own process group (vLLM's engine processes die with it), inside
a loopback-only network namespace when one is given (Mooncake listens on 0.0.0.0 whatever it is told), recording
reach when the test session collects it (`ascend_testkit.reach`). Readiness is
polled on the server's `/health` with a bound. `inside(netns)` moves the calling thread into the namespace so this
process's clients reach servers bound to the namespace's 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ascend_testkit.engine.env import vllm_cache_root
from ascend_testkit.engine.pool import make_room
from ascend_testkit.netns import LoopbackNamespace
from ascend_testkit.reach.collect import reach_env, with_reach

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1

# A chat template for the tiny word-level model (it ships none): the messages' contents, space separated.
TINY_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


class ServerStartError(RuntimeError):
    pass


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):
        os.setns(fd, _CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


@contextlib.contextmanager
def inside(netns: LoopbackNamespace | None) -> Iterator[None]:
    """Run the body with the calling thread in `netns` (a no-op for None); sockets made here stay in it."""
    if netns is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/proc/{netns.pid}/ns/net", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def serve_env(cache_root: str | os.PathLike, cpu: int | None, *, simulate: bool = True,
              one_engine_process: bool = True, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Offline, a small KV space, a private vLLM cache (model infos shared), pinned to one core, our platform in
    the simulated lane.

    `one_engine_process`: the server still runs its engine core in a child process, but vLLM's CPU platform then
    keeps the worker inside it (uniprocess executor) instead of spawning one more process that imports vLLM again:
    about 25 s less per server start here. Generation is the same.
    """
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               VLLM_CACHE_ROOT=str(vllm_cache_root(cache_root)), TOKENIZERS_PARALLELISM="false",
               VLLM_NO_USAGE_STATS="1")
    if one_engine_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if simulate:
        env["ASCEND_VLLM_SIMULATE"] = "1"
    else:
        env.pop("ASCEND_VLLM_SIMULATE", None)
    if cpu is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu)
    return with_reach(env, extra)


def p2p_kv_config(role: str, side_channel_port: int, engine_id: str, **extra) -> dict:
    """`kv_transfer_config` of an `AscendMooncakeConnector` engine (`kv_producer` or `kv_consumer`)."""
    return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": engine_id,
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"side_channel_port": side_channel_port, **extra}}


def tiny_serve_args(*, max_model_len: int = 512, max_num_seqs: int = 16, served_model_name: str = "tiny") -> list[str]:
    """vLLM server arguments for the tiny random Llama of `ascend_testkit.models.tiny_llama`."""
    return ["--dtype", "float32", "--max-model-len", str(max_model_len), "--enforce-eager",
            "--max-num-seqs", str(max_num_seqs), "--served-model-name", served_model_name,
            "--chat-template", TINY_CHAT_TEMPLATE, "--seed", "0"]


def wait_for(predicate, timeout: float, what: str, poll_s: float = 0.05) -> float:
    """Poll `predicate` until it holds; the seconds that took. Past `timeout` an AssertionError naming `what`."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(poll_s)
    return time.monotonic() - t0


def _die_with_parent() -> None:
    # The direct child (nsenter execs into python) gets SIGKILL if the test process dies without cleaning up.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerProcess:
    """One HTTP server in a child process group; `url` is where it listens, its output goes to `log_path`.

    The server dies with the thread that started it (its parent-death signal follows the creating thread, not the
    process): start servers from a thread that outlives them, never from an executor's worker thread.
    """

    def __init__(self, name: str, argv: list[str], *, port: int, env: dict[str, str], log_path: str | os.PathLike,
                 netns: LoopbackNamespace | None = None, host: str = "127.0.0.1"):
        self.name = name
        self.url = f"http://{host}:{port}"
        self.netns = netns
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        cmd = netns.command(argv) if netns is not None else argv
        # Fatal signals print every Python thread's stack to the log: `wait_healthy` aborts a hung start with one.
        env = {**env, "PYTHONFAULTHANDLER": "1"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True, preexec_fn=_die_with_parent)
        self.started_at = time.monotonic()
        self.ready_after_s: float | None = None
        self.killed = False  # by `kill` (a test's fault), as opposed to dying on its own

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def openai_client(self, timeout: float = 120.0):
        """The `openai` client of this server's OpenAI API, as a user points one at it (no retries: a test sees the
        first answer). Use it inside the server's namespace."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=timeout)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET `path` from inside the server's namespace: (status, body); status 0 when nothing answers."""
        with inside(self.netns):
            try:
                with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()
            except (urllib.error.URLError, OSError):
                return 0, b""

    def get_json(self, path: str, timeout: float = 5.0) -> dict:
        status, body = self.get(path, timeout)
        if status != 200:
            raise ServerStartError(f"{self.name}: GET {path} answered {status}: {body[:300]!r}")
        return json.loads(body)

    def collective_rpc(self, method: str, timeout: float = 60.0) -> list:
        """The workers' answers to `method` through vLLM's development endpoint /collective_rpc (the server runs with
        VLLM_SERVER_DEV_MODE=1), from inside the server's namespace."""
        req = urllib.request.Request(self.url + "/collective_rpc", method="POST",
                                     data=json.dumps({"method": method}).encode(),
                                     headers={"Content-Type": "application/json"})
        with inside(self.netns), urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())["results"]

    def metric(self, name: str) -> float:
        """The sum of `name`'s samples on the server's Prometheus /metrics (vLLM's counters and gauges); a metric the
        server does not report is an error naming it."""
        status, body = self.get("/metrics", timeout=30)
        if status != 200:
            raise AssertionError(f"{self.name}: GET /metrics answered {status}")
        values = [float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                  if line.startswith((name + "{", name + " "))]
        if not values:
            raise AssertionError(f"{self.name} reports no {name}")
        return sum(values)

    def kv_usage(self) -> float:
        """vLLM's KV cache usage (0..1): 0 once every block is free again."""
        return self.metric("vllm:kv_cache_usage_perc")

    def kv_received_tokens(self) -> float:
        """Prompt tokens whose KV this server took from its KV connector instead of computing them (vLLM's own
        counter, by source)."""
        status, body = self.get("/metrics", timeout=30)
        if status != 200:
            raise AssertionError(f"{self.name}: GET /metrics answered {status}")
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                   if line.startswith("vllm:prompt_tokens_by_source_total")
                   and 'source="external_kv_transfer"' in line)

    def wait_healthy(self, timeout: float = 600.0, path: str = "/health") -> ServerProcess:
        """Poll `path` until it answers 200; the process exiting or the bound passing is an error with the log."""
        deadline = self.started_at + timeout
        while True:
            if not self.alive:
                raise ServerStartError(f"{self.name} exited ({self.proc.returncode}) before it was healthy; "
                                       f"log tail ({self.log_path}):\n{self.log_tail()}")
            if self.get(path, timeout=2.0)[0] == 200:
                self.ready_after_s = time.monotonic() - self.started_at
                return self
            if time.monotonic() > deadline:
                self._abort_with_stacks()
                self.close()
                raise ServerStartError(f"{self.name} not healthy at {self.url}{path} within {timeout:.0f} s; "
                                       f"log tail with its processes' stacks ({self.log_path}):\n"
                                       f"{self.log_tail(160)}")
            time.sleep(0.25)

    def _abort_with_stacks(self, wait_s: float = 10.0) -> None:
        """SIGABRT the group: each of its Python processes writes where every thread of it stands to the log on the
        way out (a start that hangs says where; CI once saw a restarted server stop mid-start with no clue)."""
        self._signal_group(signal.SIGABRT)
        self._await_group_exit(time.monotonic() + wait_s)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def died_on_its_own(self) -> str | None:
        """Why a shared server is gone though no test killed it (its exit status and log tail), or None."""
        if self.alive or self.killed:
            return None
        how = f"killed by signal {-self.proc.returncode}" if self.proc.returncode < 0 else \
            f"exited with {self.proc.returncode}"
        return f"{self.name} ({self.url}) {how}; log tail:\n{self.log_tail(20)}"

    def footprint(self) -> dict[str, int]:
        """Open file descriptors and threads of every process in the server's group (its engine core too), from
        /proc: what a leak shows up in."""
        fds = threads = procs = 0
        kinds: dict[str, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) != self.proc.pid:  # field 5 of stat, the process group
                    continue
                threads += int(fields[17])  # field 20, num_threads
                for fd in os.listdir(f"/proc/{entry}/fd"):
                    target = os.readlink(f"/proc/{entry}/fd/{fd}")
                    kind = target.split(":", 1)[0] if ":" in target else "file"
                    kinds[kind] = kinds.get(kind, 0) + 1
                    fds += 1
                procs += 1
            except (OSError, IndexError, ValueError):  # a process that ended while we looked
                continue
        return {"fds": fds, "threads": threads, "processes": procs, "fd_kinds": dict(sorted(kinds.items()))}

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole group (e.g. SIGSTOP/SIGCONT: a peer that stalls, then resumes)."""
        self._signal_group(sig)

    def kill(self) -> None:
        """SIGKILL the whole group at once (fault injection: no graceful shutdown)."""
        self.killed = True
        self._signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self, timeout: float = 20.0) -> None:
        """SIGTERM the group (vLLM shuts its engine down), SIGKILL whatever is left after `timeout`.

        The server's engine processes exit after it and write their coverage (the reach check's data) on the way out:
        they get until the deadline to leave on their own, since a SIGKILL in mid-write leaves a corrupt data file that
        fails the reach check (CI once found one, 4 KiB, from a server closed the moment its API process exited)."""
        deadline = time.monotonic() + timeout
        if self.alive:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self._await_group_exit(deadline)
        self._signal_group(signal.SIGKILL)  # the engine processes of the group, if any outlived the deadline
        if self.alive:
            self.proc.wait(timeout=30)
        self._log.close()

    def _await_group_exit(self, deadline: float) -> None:
        """Until every process of the group is gone, or `deadline` (`alive` reaps the leader, whose zombie would
        otherwise keep the group alive)."""
        while (self.alive or self._group_alive()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def start_serve(name: str, model: str | os.PathLike, port: int, *, log_dir: str | os.PathLike, cpu: int | None,
                netns: LoopbackNamespace | None = None, kv_transfer_config: dict | None = None,
                args: list[str] | None = None, env_extra: dict[str, str] | None = None,
                simulate: bool = True, host: str = "127.0.0.1") -> ServerProcess:
    """`ascend-vllm serve MODEL --host HOST --port PORT [args]` (in `netns`), not yet waited for (call
    `wait_healthy`). Idle engine hosts of this process make room for it first when memory is short
    (`engine.pool.make_room`)."""
    make_room()
    log_dir = Path(log_dir)
    argv = [sys.executable, "-m", "ascend_vllm.cli", "serve", str(model), "--host", host, "--port", str(port),
            *(args if args is not None else tiny_serve_args())]
    if kv_transfer_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
    env = serve_env(log_dir / f"cache-{name}", cpu, simulate=simulate, extra=env_extra)
    return ServerProcess(name, argv, port=port, env=env, log_path=log_dir / f"{name}.log", netns=netns, host=host)


def start_router(name: str, port: int, *, prefill: list[str], decode: list[str], log_dir: str | os.PathLike,
                 netns: LoopbackNamespace | None = None, args: list[str] | None = None,
                 host: str = "127.0.0.1") -> ServerProcess:
    """`ascend-vllm router --host HOST --prefill URL … --decode URL … --port PORT [args]` (in `netns`), not yet
    waited for."""
    argv = [sys.executable, "-m", "ascend_vllm.cli", "router", "--host", host, "--port", str(port)]
    for url in prefill:
        argv += ["--prefill", url]
    for url in decode:
        argv += ["--decode", url]
    argv += list(args or [])
    env = dict(os.environ) | reach_env()
    return ServerProcess(name, argv, port=port, env=env, log_path=Path(log_dir) / f"{name}.log", netns=netns,
                         host=host)
