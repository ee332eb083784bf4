"""`HostPool`: engine hosts shared by a whole test session (or benchmark), created on first use, all reaped at the end.

A host costs one vLLM import (~15-25 s here); an engine in a warm host starts in a few seconds. So a session keeps
one host per (lane, network namespace, pinning) and every suite runs its engines on it, one after another.

An idle host still holds ~0.5 GB (torch and vLLM imported), and a session collects a dozen or more; two sessions
side by side with their engines and servers outgrew this machine's memory once (the kernel killed a server's engine).
So before an engine starts (in a host or a server, `make_room`), the pools of this process retire their least
recently used idle hosts beyond a few, and more while the machine's available memory is short of what the engines
starting now will take plus a reserve (never a host the running test used in the last minute); a retired host comes
back on its next command.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from ascend_testkit.engine.client import EngineHost

# Headroom kept for what this process cannot see (the other session's engines, a model's activations).
DEFAULT_RESERVE_MIB = 3072
# What an engine of the test models takes once loaded (~1.5 GB engine core with its KV space); an engine that started
# within START_WINDOW_S may not have taken it yet, so it still counts against what is available.
ENGINE_MIB = 1536
START_WINDOW_S = 30.0
# Idle hosts kept warm at most (a session makes a dozen or more; the ones used last are the ones used next).
DEFAULT_IDLE_HOSTS = 6
# A host used this recently is not retired: it belongs to the test running now (its reference engine, its peer).
RECENT_S = 60.0

_POOLS: weakref.WeakSet[HostPool] = weakref.WeakSet()
_STARTS: deque[float] = deque()  # when recent engines started (make_room's callers)


def reserve_bytes() -> int:
    return int(os.environ.get("ASCEND_TESTKIT_RESERVE_MIB", DEFAULT_RESERVE_MIB)) << 20


def available_bytes() -> int | None:
    """The kernel's estimate of memory available without swapping (`MemAvailable`), None where it has none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    except OSError:
        pass
    return None


def idle_hosts_kept() -> int:
    return int(os.environ.get("ASCEND_TESTKIT_IDLE_HOSTS", DEFAULT_IDLE_HOSTS))


def make_room(need: int | None = None, *, keep: EngineHost | None = None) -> list[str]:
    """Before an engine starts: retire idle hosts of every pool in this process, least recently used first, while
    more than `idle_hosts_kept()` are idle or fewer than `need` bytes are available. `need` defaults to the reserve
    plus an engine for this start and each one of the last START_WINDOW_S (still loading, e.g. a PD pair's servers
    started together). `keep` and hosts used in the last RECENT_S stay. Returns the names retired."""
    now = time.monotonic()
    while _STARTS and _STARTS[0] < now - START_WINDOW_S:
        _STARTS.popleft()
    _STARTS.append(now)
    if need is None:
        need = reserve_bytes() + len(_STARTS) * (ENGINE_MIB << 20)
    retired: list[str] = []
    while True:
        idle = sorted(((host.last_used, id(host), pool, host) for pool in list(_POOLS) for host in pool.hosts.values()
                       if host.idle), key=lambda item: item[:2])
        stale = [(pool, host) for used, _, pool, host in idle if host is not keep and used < now - RECENT_S]
        if not stale:
            break
        free = available_bytes()
        if len(idle) > idle_hosts_kept():
            why = f"{len(idle)} idle hosts, {idle_hosts_kept()} kept"
        elif free is not None and free < need:
            why = f"{free >> 20} MiB available, {need >> 20} MiB wanted"
        else:
            break
        pool, host = stale[0]
        host.retire()
        pool.retirements.append(host.name)
        retired.append(host.name)
        print(f"[ascend_testkit] retired idle engine host {host.name}: {why}", file=sys.stderr, flush=True)
    return retired


class HostPool:
    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.log_dir = Path(log_dir)
        self.hosts: dict[str, EngineHost] = {}
        self.retirements: list[str] = []
        _POOLS.add(self)

    def get(self, name: str, *, lane: str = "simulated", runner: str | None = None, netns: Any = None,
            cpus: str | int | None = None, env: dict[str, str] | None = None,
            setup: tuple[str, ...] = ()) -> EngineHost:
        """The host called `name`, started with these settings on first use (later calls must not differ)."""
        host = self.hosts.get(name)
        if host is not None and (host.alive or host.retired):
            if (host.lane, host.runner) != (lane, runner):
                raise ValueError(f"engine host {name!r} runs the {host.lane} lane with runner {host.runner}, "
                                 f"not {lane} with {runner}")
            return host
        host = EngineHost(name, lane=lane, runner=runner, log_dir=self.log_dir, cpus=cpus, env=env, netns=netns,
                          setup=setup)
        self.hosts[name] = host
        return host

    def summary(self) -> str:
        """How many hosts this pool started, and how often memory made it retire and bring one back."""
        revived = sum(host.spawns - 1 for host in self.hosts.values())
        return (f"{len(self.hosts)} engine hosts; {len(self.retirements)} retired while idle (to hold memory), "
                f"{revived} brought back{': ' + ', '.join(self.retirements) if self.retirements else ''}")

    def close(self) -> list[int]:
        """Close every host; returns the pids of any that would not die (a test should fail on them)."""
        for host in self.hosts.values():
            host.close()
        _POOLS.discard(self)
        return [h.proc.pid for h in self.hosts.values() if h.proc.poll() is None]
