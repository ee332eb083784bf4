"""Several hosts on one machine: network namespaces joined by veth pairs, each host with an address of its own.

Each host is a `LoopbackNamespace` (its holder process keeps it alive; `nsenter` starts processes in it) plus one
address. A link is a veth pair between two hosts; every host carries its one address (a /32) on each of its links
and a host route to each peer over that peer's link, so hosts reach exactly the hosts they are linked to, and
cutting one link (`ip link set ... down`) leaves the others alone. A link takes an optional `tc tbf` rate limit on
both ends, and a delay: this kernel has no netem, so `Link.delay` routes each end's traffic to the peer through a
TUN device whose process (`ascend_testkit.delay_line`) holds every packet, then sends it out of the veth end.

Nothing here touches the machine's own namespace: the veth pair is created inside the first host's namespace with
its peer end moved straight into the second's. Needs root.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from dataclasses import dataclass, field

from ascend_testkit.netns import LoopbackNamespace, NetnsUnavailableError

# Addresses of the test hosts; they exist only inside namespaces the topology created.
DEFAULT_SUBNET = "10.211.0."
# tbf refuses a bucket smaller than one (GSO-sized) packet and cannot keep its rate with a bucket under rate/HZ.
_MIN_BURST_BYTES = 256 << 10
_TBF_LATENCY_S = 0.1  # how long a packet may wait for tokens past the burst (tc's `latency`)


_CONNECT_RTT = """
import socket, sys, time
best = float("inf")
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    best = min(best, time.perf_counter() - t0)
print(best)
"""


class TopologyError(RuntimeError):
    pass


@dataclass
class Host:
    """One host: its namespace and address. Duck-types as a namespace (`pid`, `command`, `popen`) for
    `ascend_testkit.servers` (ServerProcess, inside)."""

    name: str
    address: str
    ns: LoopbackNamespace
    links: dict[str, str] = field(default_factory=dict)  # peer name -> this host's device towards it

    @property
    def pid(self) -> int:
        return self.ns.pid

    def command(self, argv: list[str]) -> list[str]:
        return self.ns.command(argv)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return self.ns.popen(argv, **kwargs)

    def run(self, argv: list[str], timeout: float = 10.0) -> str:
        """Run a short command (ip, tc) on this host; a failure raises with its stderr."""
        done = subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise TopologyError(f"{self.name}: {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def bytes_sent(self, peer: str) -> int:
        """Bytes this host sent over its link to `peer` (the veth end's counter)."""
        stats = json.loads(self.run(["ip", "-s", "-j", "link", "show", "dev", self.links[peer]]))
        return int(stats[0]["stats64"]["tx"]["bytes"])

    def round_trip_s(self, address: str, port: int, tries: int = 10) -> float:
        """The fastest of `tries` TCP connects from this host to a listener at `address:port` (one round trip
        each; a listener nobody accepts on will do, the kernel completes the handshake)."""
        out = self.run([sys.executable, "-c", _CONNECT_RTT, address, str(port), str(tries)], timeout=30 + 5 * tries)
        return float(out)

    def url(self, port: int) -> str:
        return f"http://{self.address}:{port}"

    def interfaces(self) -> list[str]:
        lines = self.run(["ip", "-o", "link", "show"]).splitlines()
        return [line.split(":")[1].strip().split("@")[0] for line in lines]


@dataclass
class Link:
    a: Host
    b: Host
    rate: str | None = None
    delay_s: float | None = None  # one way, each direction (`delay`)
    _delay_lines: list[subprocess.Popen] = field(default_factory=list, repr=False)

    @property
    def ends(self) -> tuple[tuple[Host, str, Host], tuple[Host, str, Host]]:
        return (self.a, self.a.links[self.b.name], self.b), (self.b, self.b.links[self.a.name], self.a)

    def _route(self, host: Host, dev: str, peer: Host) -> None:
        """The host route to the peer: into the delay line's TUN device while the link is delayed, else the veth."""
        via = _tun_name(peer) if self.delay_s else dev
        host.run(["ip", "route", "replace", f"{peer.address}/32", "dev", via, "src", host.address])

    def delay(self, seconds: float | None, timeout_s: float = 10.0) -> None:
        """Hold every packet `seconds` in each direction (a round trip gains twice that); None removes the delay.
        Rate limits still apply: the delayed frames leave through the veth end's queue."""
        if seconds is not None and seconds < 0:
            raise TopologyError(f"delay must be >= 0 s, got {seconds}")
        self._stop_delay_lines()
        self.delay_s = seconds or None
        if self.delay_s is None:
            for host, dev, peer in self.ends:
                self._route(host, dev, peer)
            return
        for host, dev, peer in self.ends:
            peer_dev = peer.links[host.name]
            peer_mac = json.loads(peer.run(["ip", "-j", "link", "show", "dev", peer_dev]))[0]["address"]
            mtu = json.loads(host.run(["ip", "-j", "link", "show", "dev", dev]))[0]["mtu"]
            tun = _tun_name(peer)
            proc = host.popen([sys.executable, "-m", "ascend_testkit.delay_line", "--tun", tun, "--out", dev,
                               "--peer-mac", peer_mac, "--delay-s", repr(self.delay_s)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self._delay_lines.append(proc)
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
            line = proc.stdout.readline() if ready else b""
            if line.strip() != b"ready":
                self._stop_delay_lines()
                err = proc.stderr.read().decode(errors="replace").strip() if proc.poll() is not None else ""
                raise TopologyError(f"{host.name}: the delay line towards {peer.name} did not start within "
                                    f"{timeout_s:g} s: {err or line!r}")
            host.run(["ip", "link", "set", tun, "mtu", str(mtu), "up"])
            self._route(host, dev, peer)

    def _stop_delay_lines(self) -> None:
        for proc in self._delay_lines:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self._delay_lines.clear()

    def down(self) -> None:
        """Cut the link (both ends down: no carrier; packets in flight are lost, TCP peers see silence)."""
        for host, dev, _ in self.ends:
            host.run(["ip", "link", "set", dev, "down"])

    def up(self) -> None:
        """Restore the link; the kernel dropped the host routes with the carrier, so they are laid again."""
        for host, dev, _ in self.ends:
            host.run(["ip", "link", "set", dev, "up"])
        for host, dev, peer in self.ends:
            self._route(host, dev, peer)

    def limit(self, rate: str | None) -> None:
        """`tc tbf` at `rate` (tc's syntax: "5gbit", "800mbit") on both ends' egress; None removes the limit."""
        for host, dev, _ in self.ends:
            if rate is None:
                subprocess.run(
                    host.command(["tc", "qdisc", "del", "dev", dev, "root"]),
                    capture_output=True,
                    timeout=10,
                    check=False,
                )  # none there is fine
                continue
            burst = tbf_burst_bytes(rate)
            host.run(
                [
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    str(burst),
                    "latency",
                    f"{int(_TBF_LATENCY_S * 1000)}ms",
                ]
            )
        self.rate = rate

    def is_up(self) -> bool:
        return all("LOWER_UP" in host.run(["ip", "link", "show", dev]) for host, dev, _ in self.ends)


def _tun_name(peer: Host) -> str:
    return f"dl-{peer.name}"[:15]


def tbf_burst_bytes(rate: str) -> int:
    """The bucket `Link.limit` gives a rate: what crosses at once before the rate holds (10 ms of traffic, or the
    smallest bucket tbf keeps its rate with)."""
    return max(_MIN_BURST_BYTES, rate_bits_per_s(rate) // 8 // 100)


def tbf_queue_delay_s(rate: str) -> float:
    """The longest a packet waits in `Link.limit`'s queue at `rate`: tbf queues up to burst + rate x latency bytes,
    and every packet on the link (a side-channel reply too) waits behind what bulk traffic queued before it."""
    bytes_per_s = rate_bits_per_s(rate) / 8
    return (tbf_burst_bytes(rate) + bytes_per_s * _TBF_LATENCY_S) / bytes_per_s


def rate_bits_per_s(rate: str) -> int:
    """Bits per second of a tc rate ("5gbit", "800mbit")."""
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return int(float(rate[: -len(unit)]) * scale)
    raise TopologyError(f"rate {rate!r}: expected a number followed by bit, kbit, mbit or gbit")


class Topology:
    """`Topology(["a", "b", "c"], links=[("a", "b"), ("b", "c")])`: hosts and the links between them (default:
    every pair linked). `rate` limits every link; `topology.link("a", "b")` cuts, restores or limits one."""

    def __init__(
        self,
        names: list[str],
        links: list[tuple[str, str]] | None = None,
        *,
        rate: str | None = None,
        subnet: str = DEFAULT_SUBNET,
        timeout_s: float = 10.0,
    ):
        if len(set(names)) != len(names) or not names:
            raise TopologyError(f"host names must be distinct and non-empty: {names}")
        self.hosts: dict[str, Host] = {}
        self._links: dict[frozenset[str], Link] = {}
        try:
            for i, name in enumerate(names, start=1):
                self.hosts[name] = Host(name, f"{subnet}{i}", LoopbackNamespace(timeout_s))
            pairs = links if links is not None else [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
            for a, b in pairs:
                self._connect(self.hosts[a], self.hosts[b], rate)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def link(self, a: str, b: str) -> Link:
        return self._links[frozenset((a, b))]

    def _connect(self, a: Host, b: Host, rate: str | None) -> None:
        # Device names are per namespace: "to-<peer>" reads well in `ip link` and cannot clash.
        dev_a, dev_b = f"to-{b.name}"[:15], f"to-{a.name}"[:15]
        a.run(["ip", "link", "add", dev_a, "type", "veth", "peer", "name", dev_b, "netns", str(b.pid)])
        a.links[b.name], b.links[a.name] = dev_a, dev_b
        for host, dev, peer in ((a, dev_a, b), (b, dev_b, a)):
            host.run(["ip", "addr", "add", f"{host.address}/32", "dev", dev])
            host.run(["ip", "link", "set", dev, "up"])
            host.run(["ip", "route", "replace", f"{peer.address}/32", "dev", dev, "src", host.address])
        link = Link(a, b)
        self._links[frozenset((a.name, b.name))] = link
        if rate is not None:
            link.limit(rate)

    def close(self) -> None:
        """End every host's namespace (its veth ends go with it) and every delay line."""
        for link in self._links.values():
            link._stop_delay_lines()
        for host in self.hosts.values():
            host.ns.close()

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["DEFAULT_SUBNET", "Host", "Link", "NetnsUnavailableError", "Topology", "TopologyError", "rate_bits_per_s"]
