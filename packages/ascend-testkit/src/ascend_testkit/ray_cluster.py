"""A Ray cluster across the hosts of a `Topology` (`ascend_testkit.hosts`), as a user starts one on each machine: `ray
start --head` on one host, `ray start --address <head>:<port>` on the others, each node bound to its host's own
address and advertising its NPUs (`--resources '{"NPU": N}'`: our platform's `ray_device_key`), so vLLM's Ray
executor places one worker per NPU bundle across the hosts.

Each node runs `ray start --block` in a process group of its own: the raylet, the head's GCS and every worker the
raylet forks stay in that group, so stopping a node (`RayNode.stop`) ends exactly the processes it started. (`ray
stop` would not do: it kills every Ray process of the machine by name, other hosts' and other tests' included.)
Each node keeps its session files in a temporary folder of its own. The node's environment is what its workers
inherit first (vLLM's Ray executor only fills in what a node does not set): the simulated lane, the node's core,
and what vLLM on a multi-host deployment needs (`host_servers.node_env`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ascend_testkit.host_servers import node_env
from ascend_testkit.hosts import Host
from ascend_testkit.servers import _die_with_parent, serve_env

GCS_PORT = 6380
# Ray's smallest object store; vLLM's Ray executors pass scheduler outputs through their own message queues.
OBJECT_STORE_BYTES = 80 * 1024 * 1024
# The actor class of vLLM's Ray workers (RayExecutorV2), as Ray titles the actor's process.
WORKER_PROCESS_TITLE = "ray::RayWorkerProc"


class RayClusterError(RuntimeError):
    pass


def _title(proc_dir: Path) -> str:
    """A process's title: the first word of its command line (Ray retitles its workers `ray::<ActorClass>…`)."""
    return (proc_dir / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")


def ray_cli() -> str:
    """The `ray` command of this interpreter's environment."""
    return str(Path(sys.executable).with_name("ray"))


@dataclass
class RayNode:
    name: str
    host: Host
    proc: subprocess.Popen
    temp_dir: Path
    log_path: Path
    _log: object = field(repr=False, default=None)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def pids(self) -> list[int]:
        """Every live process of this node: its group (the `ray start` process, the GCS, the raylet, its agents)
        and any Ray-titled process (`ray::…`: a worker the raylet forked) in the host's namespace, should one have
        left the group. An exited process awaiting its parent's reaping is not counted."""
        net = os.readlink(f"/proc/{self.host.pid}/ns/net")
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                state, _ppid, pgid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
                if state in ("Z", "X"):
                    continue
                if int(pgid) == self.proc.pid or (_title(entry).startswith("ray::")
                                                  and os.readlink(entry / "ns" / "net") == net):
                    pids.append(int(entry.name))
        return pids

    def worker_pids(self, title: str = WORKER_PROCESS_TITLE) -> list[int]:
        """This node's processes titled `title` (Ray titles an actor's process `ray::<ActorClass>`)."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(OSError):
                if _title(Path(f"/proc/{pid}")).startswith(title):
                    found.append(pid)
        return found

    def log_tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM `ray start --block` (it then stops the node's processes in order), SIGKILL whatever of the group
        is left after `timeout`; the session folder goes too."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.2)  # reaps our direct child
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL every process of the node at once (a host lost: no goodbye to the head)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def ray_node_args(host: Host, *, head: Host | None, port: int = GCS_PORT, npus: int = 1, num_cpus: int = 1,
                  object_store_bytes: int = OBJECT_STORE_BYTES) -> list[str]:
    """`ray start` arguments of one node on `host`: the head (`head=None`) or a worker joining `head`'s GCS."""
    args = ["--node-ip-address", host.address, "--num-cpus", str(num_cpus), "--num-gpus", "0",
            "--resources", json.dumps({"NPU": npus}), "--object-store-memory", str(object_store_bytes),
            "--disable-usage-stats"]
    if head is None:
        return ["--head", "--port", str(port), "--include-dashboard", "false", *args]
    return ["--address", f"{head.address}:{port}", *args]


def start_ray_node(name: str, host: Host, *, peer: str, head: Host | None, log_dir: str | os.PathLike,
                   cpu: int | str | None, port: int = GCS_PORT, npus: int = 1,
                   env_extra: dict[str, str] | None = None) -> RayNode:
    """`ray start [--head | --address <head>:<port>] --node-ip-address <host's address> --resources '{"NPU": n}'
    --block` on `host`, in its own process group, with the simulated lane's environment pinned to `cpu` plus
    `node_env(host, peer)`; not yet waited for (`RayCluster.wait_nodes`)."""
    log_dir = Path(log_dir)
    # Short: Ray's Unix sockets live under it (a socket path has ~107 characters at most).
    temp_dir = Path(tempfile.mkdtemp(prefix=f"ray-{name}-"))
    argv = [ray_cli(), "start", "--block", "--temp-dir", str(temp_dir),
            *ray_node_args(host, head=head, port=port, npus=npus)]
    env = serve_env(log_dir / f"cache-{name}", None if cpu is None else int(str(cpu).split(",")[0]),
                    extra={**node_env(host, peer), "RAY_USAGE_STATS_ENABLED": "0", **(env_extra or {})})
    if cpu is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu)
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the node
    proc = subprocess.Popen(host.command(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True, preexec_fn=_die_with_parent)
    return RayNode(name, host, proc, temp_dir, log_path, log)


class RayCluster:
    """A head on `hosts[0]` and one worker node on each other host (each linked to the head's host), started in
    that order; `address` is the head's GCS, what `RAY_ADDRESS` names for a driver on the head's host."""

    def __init__(self, hosts: list[Host], *, log_dir: str | os.PathLike, cpus: list[int | str | None],
                 port: int = GCS_PORT, npus: int = 1, env_extra: dict[str, str] | None = None):
        self.head_host = hosts[0]
        self.port = port
        self.nodes: list[RayNode] = []
        try:
            for i, (host, cpu) in enumerate(zip(hosts, cpus, strict=True)):
                peer = hosts[1].name if i == 0 else hosts[0].name
                self.nodes.append(start_ray_node(f"ray-{host.name}", host, peer=peer, head=None if i == 0 else hosts[0],
                                                 log_dir=log_dir, cpu=cpu, port=port, npus=npus, env_extra=env_extra))
                if i == 0:
                    self.wait_nodes(1, timeout=60)
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return f"{self.head_host.address}:{self.port}"

    def status(self, timeout: float = 30.0) -> str:
        """`ray status --address <head>` run on the head's host."""
        done = subprocess.run(self.head_host.command([ray_cli(), "status", "--address", self.address]),
                              capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        if done.returncode != 0:
            raise RayClusterError(f"ray status failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done.stdout

    def active_nodes(self) -> int:
        """Nodes `ray status` lists as active (0 while the GCS does not answer)."""
        try:
            status = self.status()
        except (RayClusterError, subprocess.TimeoutExpired):
            return 0
        active = status.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in status else ""
        return len(re.findall(r"\bnode_[0-9a-f]+", active))

    def wait_nodes(self, n: int, timeout: float) -> float:
        """Wait until `n` nodes are active; the seconds it took. A node that exits, or the bound, raises."""
        t0 = time.monotonic()
        while self.active_nodes() < n:
            for node in self.nodes:
                if not node.alive:
                    raise RayClusterError(f"Ray node {node.name} exited ({node.proc.returncode}):\n"
                                          f"{node.log_tail()}")
            if time.monotonic() - t0 > timeout:
                raise RayClusterError(f"{n} Ray nodes not active within {timeout} s:\n{self.status()}")
            time.sleep(1.0)
        return time.monotonic() - t0

    def driver_env(self, host: Host, peer: str) -> dict[str, str]:
        """The environment of a Ray driver (`ascend-vllm serve --distributed-executor-backend ray`) on `host`: the
        cluster to join (`RAY_ADDRESS`: otherwise Ray starts a cluster of its own, without NPUs), vLLM's address and
        gloo's interface (`node_env`), and Ray's `uv run` hook off: a driver under `uv run` (this test session)
        would have Ray ship the working directory to each worker and build a fresh virtual environment there,
        without Ray in it, instead of running the workers in the environment the nodes were started from."""
        return {**node_env(host, peer), "RAY_ADDRESS": self.address, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                "RAY_USAGE_STATS_ENABLED": "0"}

    def stop(self) -> None:
        """Stop the worker nodes, then the head (each bounded)."""
        for node in reversed(self.nodes):
            node.stop()

    def leftovers(self) -> dict[str, list[int]]:
        return {node.name: pids for node in self.nodes if (pids := node.pids())}
