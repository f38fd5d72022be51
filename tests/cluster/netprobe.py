"""Tiny network probe run on harness hosts by the harness's own tests (stdlib only).

serve PORT [mcast]   TCP echo and UDP receiver on PORT, with `mcast` also a member of the mDNS
                     group (netns hosts only: never join groups on a real network); logs receipts
tcp-echo HOST PORT PAYLOAD TIMEOUT_S   connect, send, print the echo; exit 1 on failure
udp HOST PORT PAYLOAD                  send one datagram
mcast PAYLOAD                          send one datagram to the mDNS group
sleeper              start a child `sleep`, print both pids, sleep until killed
"""

from __future__ import annotations

import selectors
import socket
import struct
import subprocess
import sys
import time

MDNS_GROUP = "224.0.0.251"
MDNS_PORT = 5353


def serve(port: int, with_mcast: bool) -> None:
    tcp = socket.create_server(("0.0.0.0", port))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    selector = selectors.DefaultSelector()
    selector.register(tcp, selectors.EVENT_READ)
    selector.register(udp, selectors.EVENT_READ)
    mcast = None
    if with_mcast:
        mcast = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        mcast.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        mcast.bind((MDNS_GROUP, MDNS_PORT))
        group = struct.pack("4s4s", socket.inet_aton(MDNS_GROUP), socket.inet_aton("0.0.0.0"))
        mcast.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, group)
        selector.register(mcast, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is tcp:
                conn, _peer = tcp.accept()
                with conn:
                    conn.settimeout(2.0)
                    conn.sendall(conn.recv(1024))
            else:
                data, (src, _src_port) = sock.recvfrom(1024)
                kind = "mcast" if sock is mcast else "udp"
                print(f"{kind} from {src}: {data.decode()}", flush=True)


def tcp_echo(host: str, port: int, payload: str, timeout_s: float) -> int:
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(payload.encode())
            print(conn.recv(1024).decode())
    except OSError as exc:
        print(f"tcp-echo failed: {exc!r}")
        return 1
    return 0


def send_udp(host: str, port: int, payload: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        sock.sendto(payload.encode(), (host, port))


def sleeper() -> None:
    child = subprocess.Popen(["sleep", "600"])
    print(f"ready {child.pid}", flush=True)
    while True:
        time.sleep(60)


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "serve":
        serve(int(args[0]), with_mcast=args[1:] == ["mcast"])
    elif command == "tcp-echo":
        return tcp_echo(args[0], int(args[1]), args[2], float(args[3]))
    elif command == "udp":
        send_udp(args[0], int(args[1]), args[2])
    elif command == "mcast":
        send_udp(MDNS_GROUP, MDNS_PORT, args[0])
    elif command == "sleeper":
        sleeper()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
