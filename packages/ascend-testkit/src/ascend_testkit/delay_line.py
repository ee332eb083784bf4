"""A delay line for one direction of a test link: this machine's kernel has no netem, so delay comes from a process.

`python -m ascend_testkit.delay_line --tun NAME --out DEV --peer-mac MAC --delay-s S`, run inside a host's namespace
(`hosts.Link.delay` starts one at each end): it creates the TUN device NAME, prints "ready", and from then on every
IP packet the host routes into NAME (its route to the peer points there) is held for S seconds, in order, then sent
as an Ethernet frame out of DEV (the host's veth end towards the peer) straight to the peer's MAC. Sending on a raw
packet socket, not back through the kernel, keeps the host's routing untouched: no forwarding, no source-address
checks. It runs until its stdin closes (it dies with the test that started it) or it is killed; a TUN device goes
with its last open file, so nothing is left behind.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import os
import select
import socket
import struct
import sys
import time

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_ETH_P_IPV4 = 0x0800
_MAX_PACKET = 1 << 16


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


def _mac_bytes(mac: str) -> bytes:
    return bytes(int(part, 16) for part in mac.split(":"))


def run(tun: str, out: str, peer_mac: str, delay_s: float) -> None:
    tun_fd = open_tun(tun)
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    raw.bind((out, 0))
    own_mac = raw.getsockname()[4]
    header = _mac_bytes(peer_mac) + own_mac + struct.pack("!H", _ETH_P_IPV4)
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    print("ready", flush=True)
    stdin = sys.stdin.fileno()
    while True:
        wait = max(0.0, held[0][0] - time.monotonic()) if held else None
        readable, _, _ = select.select([tun_fd, stdin], [], [], wait)
        if stdin in readable and not os.read(stdin, 1 << 12):
            return  # whoever started us is gone
        if tun_fd in readable:
            due = time.monotonic() + delay_s
            while True:
                try:
                    packet = os.read(tun_fd, _MAX_PACKET)
                except BlockingIOError:
                    break
                if packet and packet[0] >> 4 == 4:  # IPv4 only: the test hosts carry no IPv6 addresses
                    held.append((due, packet))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet = held.popleft()
            with contextlib.suppress(OSError):  # the link is down (a test cut it): lost, as on a wire
                raw.send(header + packet)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tun", required=True, help="name of the TUN device to create")
    parser.add_argument("--out", required=True, help="the device the delayed frames leave by")
    parser.add_argument("--peer-mac", required=True, help="MAC address of the peer's end of the link")
    parser.add_argument("--delay-s", type=float, required=True, help="one-way delay added to every packet")
    args = parser.parse_args(argv)
    if args.delay_s < 0:
        parser.error(f"--delay-s must be >= 0, got {args.delay_s}")
    run(args.tun, args.out, args.peer_mac, args.delay_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
