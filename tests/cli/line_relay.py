#!/usr/bin/env python3
"""line_relay.py - a man in the middle for tests of line protocols (fleetrun's coordinator):
listens on LISTEN (host:port), connects each client to TARGET (host:port, retried for 30 s),
copies both ways, and writes every byte to CAPTURE.up (client -> target) and CAPTURE.down
(target -> client). With --flip up:N or down:N it changes one byte of the Nth line (from 1) of
that direction (the 67th, or the last before the newline when shorter) before passing it on.
Prints "ready" on stdout once it listens; runs until killed."""
import argparse
import socket
import sys
import threading
import time


def endpoint(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def pump(src, dst, capture, flip_line):
    lines, pending = 0, b""
    with open(capture, "ab", buffering=0) as cap:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            cap.write(data)
            if flip_line:
                pending += data
                out = b""
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    lines += 1
                    if lines == flip_line and line:
                        k = min(66, len(line) - 1)
                        line = line[:k] + bytes([line[k] ^ 0x01]) + line[k + 1:]
                    out += line + b"\n"
                data = out
            try:
                dst.sendall(data)
            except OSError:
                break
    for s in (dst, src):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client, target, capture, flip):
    deadline = time.monotonic() + 30
    while True:
        try:
            upstream = socket.create_connection(target)
            break
        except OSError:
            if time.monotonic() > deadline:
                client.close()
                return
            time.sleep(0.05)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    direction, n = flip
    threading.Thread(target=pump, daemon=True,
                     args=(client, upstream, capture + ".up", n if direction == "up" else 0)).start()
    threading.Thread(target=pump, daemon=True,
                     args=(upstream, client, capture + ".down", n if direction == "down" else 0)).start()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("listen", type=endpoint)
    ap.add_argument("target", type=endpoint)
    ap.add_argument("capture")
    ap.add_argument("--flip", default="none:0")
    a = ap.parse_args()
    direction, n = a.flip.split(":")
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(a.listen)
    srv.listen(8)
    print("ready", flush=True)
    while True:
        client, _ = srv.accept()
        serve(client, a.target, a.capture, (direction, int(n)))


if __name__ == "__main__":
    sys.exit(main())
