"""A loopback-only network namespace that processes can be started in.

Mooncake and its side channels listen on 0.0.0.0 whatever host they are given, so tests, benchmarks and the demo run
their engines inside a private namespace holding only `lo`: a holder process (`unshare -n` + `ip link set lo up`)
keeps the namespace alive and `nsenter` starts processes in it. Needs root (CAP_SYS_ADMIN).
"""

from __future__ import annotations

import select
import shutil
import subprocess


class NetnsUnavailableError(RuntimeError):
    pass


class LoopbackNamespace:
    HOLDER_SCRIPT = "ip link set lo up && echo up && exec cat >/dev/null"

    def __init__(self, timeout_s: float = 10.0):
        for tool in ("unshare", "nsenter", "ip"):
            if shutil.which(tool) is None:
                raise NetnsUnavailableError(f"{tool!r} not found; a loopback-only network namespace needs util-linux "
                                            "and iproute2")
        # The holder prints once `lo` is up, then waits for its stdin to close (so it dies with us).
        self._holder = subprocess.Popen(["unshare", "-n", "sh", "-c", self.HOLDER_SCRIPT], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Wait on the pipe, not in readline(): a holder that never prints must not hang the caller past timeout_s.
        ready, _, _ = select.select([self._holder.stdout], [], [], timeout_s)
        line = self._holder.stdout.readline() if ready else b""
        if line.strip() != b"up":
            self._holder.kill()
            self._holder.wait(timeout=5)
            err = self._holder.stderr.read().decode(errors="replace").strip() if self._holder.stderr else ""
            why = err or (f"the namespace's holder did not report within {timeout_s:g} s" if not ready else
                          f"the holder printed {line!r}")
            raise NetnsUnavailableError(f"cannot create a loopback-only network namespace (root needed): {why}")
        self.pid = self._holder.pid

    def command(self, argv: list[str]) -> list[str]:
        """`argv` wrapped to run inside the namespace."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--", *argv]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def close(self) -> None:
        if self._holder.poll() is None:
            if self._holder.stdin:
                self._holder.stdin.close()
            try:
                self._holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.wait(timeout=5)

    def __enter__(self) -> LoopbackNamespace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

