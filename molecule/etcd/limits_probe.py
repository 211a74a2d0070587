#!/usr/bin/env python3
"""What one client may take from an etcd member, measured from the outside (stdlib only).

``streams``: one HTTP/2 connection to etcd's client port (h2c on a plain-HTTP member, TLS
with ALPN h2 and a client certificate on an mTLS one) that opens ``--open`` gRPC Watch
streams at once, each with a watch-create request, as a client ignoring the server's
SETTINGS would. It prints the SETTINGS_MAX_CONCURRENT_STREAMS the member advertises
(roles/etcd's etcd_max_concurrent_streams; etcd's default 4294967295), how many streams etcd
answered (a response HEADERS frame: the watch was created) and how many it refused
(RST_STREAM, its first error code per stream: REFUSED_STREAM, 7, from etcd's gRPC server on
h2c and from Go's HTTP/2 server on TLS, as the streams were sent before the client had
acknowledged the server's SETTINGS).

``connect``: ``--count`` TCP connections to one port, held open for ``--hold`` seconds; prints
how many were accepted and how many refused (a reset: the metrics port's nftables limit,
roles/etcd's etcd_metrics_conn_limit_*) as soon as all were tried, with its PID (to end the
hold early), to stdout and to ``--out``.

Used by molecule/etcd/metrics_limit.yml (on the members and the control node) and by
tests/test_etcd_limits.py (against an etcd on loopback).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import struct
import sys
import time
from typing import Any

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2);
    names and values here are shorter than 127 bytes."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


def watch_request(key: bytes) -> bytes:
    """A gRPC message: WatchRequest{create_request: WatchCreateRequest{key}} (protobuf)."""
    create = b"\x0a" + bytes([len(key)]) + key
    message = b"\x0a" + bytes([len(create)]) + create
    return b"\x00" + struct.pack(">I", len(message)) + message


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def streams(host: str, port: int, count: int, tls: dict[str, str] | None = None,
            key: str = "/limits-probe", wait: float = 5.0) -> dict[str, Any]:
    """Open ``count`` Watch streams on one connection; what etcd advertised and answered."""
    raw = socket.create_connection((host, port), timeout=10)
    sock: socket.socket = raw
    if tls:
        ctx = ssl.create_default_context(cafile=tls["ca"])
        ctx.load_cert_chain(tls["cert"], tls["key"])
        ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(raw, server_hostname=host)
        if sock.selected_alpn_protocol() != "h2":
            raise ConnectionError(f"ALPN gave {sock.selected_alpn_protocol()!r}, not h2")
    scheme = "https" if tls else "http"
    out = [PREFACE, frame(SETTINGS, 0, 0)]
    for i in range(count):
        sid = 2 * i + 1
        block = b"".join(_literal(n, v) for n, v in (
            (":method", "POST"), (":scheme", scheme), (":path", "/etcdserverpb.Watch/Watch"),
            (":authority", f"{host}:{port}"), ("content-type", "application/grpc"), ("te", "trailers")))
        out += [frame(HEADERS, END_HEADERS, sid, block), frame(DATA, 0, sid, watch_request(key.encode()))]
    sock.sendall(b"".join(out))
    advertised: int | None = None
    answered: set[int] = set()
    refused: dict[int, int] = {}
    goaway = ""
    sock.settimeout(0.5)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and len(answered) + len(refused) < count:
        try:
            head = _read_exact(sock, 9)
        except TimeoutError:
            continue
        except OSError as err:
            goaway = goaway or f"connection ended: {err}"
            break
        length = int.from_bytes(head[:3], "big")
        kind, flags, sid = head[3], head[4], struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
        sock.settimeout(10)
        payload = _read_exact(sock, length)
        sock.settimeout(0.5)
        if kind == SETTINGS and not flags & ACK:
            for off in range(0, len(payload) - 5, 6):
                ident, value = struct.unpack(">HI", payload[off:off + 6])
                if ident == SETTINGS_MAX_CONCURRENT_STREAMS:
                    advertised = value
            sock.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            sock.sendall(frame(PING, ACK, 0, payload))
        elif kind == HEADERS and sid:
            answered.add(sid)
        elif kind == RST_STREAM:
            refused.setdefault(sid, struct.unpack(">I", payload[:4])[0])
        elif kind == GOAWAY:
            goaway = f"GOAWAY error code {struct.unpack('>I', payload[4:8])[0]}"
            break
    sock.close()
    return {"advertised": advertised, "opened": count, "answered": len(answered - set(refused)),
            "refused": len(refused), "refused_codes": sorted(set(refused.values())), "goaway": goaway}


def connect(host: str, port: int, count: int) -> tuple[list[socket.socket], dict[str, Any]]:
    """``count`` TCP connections: the open sockets and what happened to each attempt."""
    held: list[socket.socket] = []
    refused, other = 0, []
    for _ in range(count):
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.settimeout(5)
        try:
            s.connect((host, port))
            held.append(s)
        except ConnectionRefusedError:   # a TCP reset: nftables' reject with tcp reset
            refused += 1
            s.close()
        except OSError as err:           # a timeout would be a DROP, not a reject
            other.append(type(err).__name__ + ": " + str(err))
            s.close()
    return held, {"tried": count, "open": len(held), "refused": refused, "other": other,
                  "pid": os.getpid()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("streams", help="HTTP/2 streams on one connection to the client port")
    s.add_argument("host")
    s.add_argument("port", type=int)
    s.add_argument("--open", type=int, required=True)
    s.add_argument("--cacert")
    s.add_argument("--cert")
    s.add_argument("--key")
    c = sub.add_parser("connect", help="TCP connections held open")
    c.add_argument("host")
    c.add_argument("port", type=int)
    c.add_argument("--count", type=int, required=True)
    c.add_argument("--hold", type=float, default=0)
    c.add_argument("--out")
    args = ap.parse_args(argv)
    if args.cmd == "streams":
        tls = {"ca": args.cacert, "cert": args.cert, "key": args.key} if args.cacert else None
        print(json.dumps(streams(args.host, args.port, args.open, tls)))
        return 0
    held, result = connect(args.host, args.port, args.count)
    text = json.dumps(result)
    print(text, flush=True)
    if args.out:
        with open(args.out + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        os.replace(args.out + ".tmp", args.out)
    time.sleep(args.hold)
    for sock in held:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
