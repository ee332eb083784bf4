"""`HostPool`: engine hosts shared by a whole test session (or benchmark), created on first use, all reaped at the end.

A host costs one vLLM import (~15-25 s here); an engine in a warm host starts in a few seconds. So a session keeps
one host per (lane, network namespace, pinning) and every suite runs its engines on it, one after another.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ascend_testkit.engine.client import EngineHost


class HostPool:
    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.log_dir = Path(log_dir)
        self.hosts: dict[str, EngineHost] = {}

    def get(self, name: str, *, lane: str = "simulated", runner: str | None = None, netns: Any = None,
            cpus: str | int | None = None, env: dict[str, str] | None = None,
            setup: tuple[str, ...] = ()) -> EngineHost:
        """The host called `name`, started with these settings on first use (later calls must not differ)."""
        host = self.hosts.get(name)
        if host is not None and host.proc.poll() is None:
            if (host.lane, host.runner) != (lane, runner):
                raise ValueError(f"engine host {name!r} runs the {host.lane} lane with runner {host.runner}, "
                                 f"not {lane} with {runner}")
            return host
        host = EngineHost(name, lane=lane, runner=runner, log_dir=self.log_dir, cpus=cpus, env=env, netns=netns,
                          setup=setup)
        self.hosts[name] = host
        return host

    def close(self) -> list[int]:
        """Close every host; returns the pids of any that would not die (a test should fail on them)."""
        for host in self.hosts.values():
            host.close()
        return [h.proc.pid for h in self.hosts.values() if h.proc.poll() is None]
