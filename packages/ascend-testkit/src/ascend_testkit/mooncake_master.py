"""A `mooncake_master` (the Mooncake Store's metadata and eviction service) run inside a loopback-only namespace.

Used by the KV pool's tests, benchmark and demo. The master serves on 127.0.0.1 (some of its ports bind 0.0.0.0
whatever they are told, hence the namespace); start-up waits, bounded, until its RPC port accepts connections.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ascend_testkit.netns import LoopbackNamespace

_CONNECT = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        socket.create_connection((sys.argv[3], int(sys.argv[1])), timeout=1).close()
        sys.exit(0)
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.1)
"""


class MooncakeMasterError(RuntimeError):
    pass


def master_binary() -> str:
    """The `mooncake_master` of the Mooncake wheel in this environment."""
    beside = Path(sys.executable).with_name("mooncake_master")
    found = str(beside) if beside.exists() else shutil.which("mooncake_master")
    if not found:
        raise MooncakeMasterError("mooncake_master not found; install `mooncake-transfer-engine-non-cuda`")
    return found


class MooncakeMaster:
    """`mooncake_master` inside a loopback namespace; the default port sits below Linux's ephemeral range
    (32768-60999), where engines alive in the same namespace take theirs."""

    def __init__(self, netns: LoopbackNamespace, log_path: str | os.PathLike, *, rpc_port: int = 27051,
                 metrics_port: int | None = None, flags: dict[str, object] | None = None, timeout_s: float = 30.0,
                 rpc_address: str = "127.0.0.1"):
        self.netns = netns
        self.rpc_port = rpc_port
        self.rpc_address = rpc_address  # a test host's own address (`ascend_testkit.hosts`) serves other hosts
        self.log_path = Path(log_path)
        argv = [master_binary(), f"--rpc_port={rpc_port}", f"--rpc_address={rpc_address}",
                f"--metrics_port={metrics_port or rpc_port + 1}", "--metrics_host=127.0.0.1"]
        argv += [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (flags or {}).items()]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = netns.popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        probe = netns.popen([sys.executable, "-c", _CONNECT, str(rpc_port), str(timeout_s), rpc_address])
        try:
            ok = probe.wait(timeout=timeout_s + 10) == 0
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.wait(timeout=10)
            ok = False
        if not ok or self.proc.poll() is not None:
            self.close()
            raise MooncakeMasterError(f"mooncake_master did not listen on {rpc_address}:{rpc_port} within "
                                      f"{timeout_s} s (log: {self.log_path})")

    @property
    def address(self) -> str:
        return f"{self.rpc_address}:{self.rpc_port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the master hard (fault injection)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def __enter__(self) -> MooncakeMaster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
