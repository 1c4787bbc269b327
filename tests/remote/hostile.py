#!/usr/bin/env python3
"""A hostile S3/HTTP server for the deadline and budget tests (test_remote_hostile.c).

Standard library only; listens on 127.0.0.1 only, on a free port it prints as "PORT <n>" on
stdout (one line, flushed), and stops by itself after --lifetime seconds (default 120) or
--max-requests requests (default 3000), whichever comes first. Every answer closes its connection.

The first path segment (the S3 bucket, in path style) chooses the behaviour:

  /endless/?list-type=2...   a listing that never ends: every page has IsTruncated=true, a new
                             NextContinuationToken and 5 keys (with 200 bytes of padding each)
  /slowlist/?list-type=2...  the same, each page 0.2 s late (a deadline, not a budget, ends it)
  /drip/KEY                  HEAD: 200, Content-Length 1000. GET: the right status and headers
                             for the range asked, then 1 byte every 2 s
  /huge/KEY                  HEAD: 200, Content-Length 1000. GET: 206 with Content-Length 10^15,
                             then 1 MiB of bytes and a close
  /hugehead/KEY              HEAD and GET: Content-Length 10^18 (an object no store holds)
  /long/KEY                  HEAD: 200, Content-Length 1000. GET: 206 without Content-Length,
                             ten times the bytes of the range asked, then a close
  anything else              404 with an S3-style error body

Each connection's handler ends within --lifetime too (a drip stops when the client goes away or
the server's time is up).
"""

import argparse
import re
import socketserver
import sys
import threading
import time
import urllib.parse

MAX_HEADER = 64 * 1024
OBJECT_SIZE = 1000


class State:
    def __init__(self, lifetime, max_requests):
        self.end = time.monotonic() + lifetime
        self.lock = threading.Lock()
        self.requests = 0
        self.max_requests = max_requests
        self.done = threading.Event()

    def count(self):
        with self.lock:
            self.requests += 1
            if self.requests >= self.max_requests:
                self.done.set()

    def left(self):
        return self.end - time.monotonic()


STATE = None


def read_request(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_HEADER:
            return None
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 2:
        return None
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    url = urllib.parse.urlsplit(parts[1])
    return parts[0].upper(), url.path, urllib.parse.parse_qs(url.query), headers


def send_head(sock, status, headers):
    reason = {200: "OK", 206: "Partial Content", 404: "Not Found"}.get(status, "OK")
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers] + ["Connection: close", "", ""]
    sock.sendall("\r\n".join(lines).encode("latin-1"))


def asked_range(headers):
    m = re.match(r"bytes=(\d+)-(\d+)$", headers.get("range", ""))
    if not m:
        return 0, OBJECT_SIZE - 1
    return int(m.group(1)), min(int(m.group(2)), OBJECT_SIZE - 1)


def listing(sock, bucket, query, delay):
    if delay:
        time.sleep(delay)
    token = query.get("continuation-token", ["t0"])[0]
    n = int(token[1:]) + 1 if re.match(r"t\d+$", token) else 1
    prefix = query.get("prefix", [""])[0]
    keys = "".join(f"<Contents><Key>{prefix}k{n}-{i}</Key><Size>1</Size>"
                   f"<StorageClass>{'X' * 200}</StorageClass></Contents>" for i in range(5))
    body = (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>{bucket}</Name>'
            f"<Prefix>{prefix}</Prefix><KeyCount>5</KeyCount><MaxKeys>1000</MaxKeys>"
            f"<IsTruncated>true</IsTruncated><NextContinuationToken>t{n}</NextContinuationToken>"
            f"{keys}</ListBucketResult>").encode()
    send_head(sock, 200, [("Content-Type", "application/xml"), ("Content-Length", len(body))])
    sock.sendall(body)


def drip(sock, headers):
    first, last = asked_range(headers)
    n = last - first + 1
    send_head(sock, 206, [("Content-Length", n), ("Content-Range", f"bytes {first}-{last}/{OBJECT_SIZE}")])
    for _ in range(n):
        if STATE.left() <= 0:
            return
        sock.sendall(b"x")
        time.sleep(2)


def huge(sock, headers):
    first, last = asked_range(headers)
    send_head(sock, 206, [("Content-Length", 10 ** 15), ("Content-Range", f"bytes {first}-{last}/{OBJECT_SIZE}")])
    block = b"h" * 65536
    for _ in range(16):
        sock.sendall(block)


def long_body(sock, headers):
    first, last = asked_range(headers)
    send_head(sock, 206, [("Content-Range", f"bytes {first}-{last}/{OBJECT_SIZE}")])
    sock.sendall(b"L" * (10 * (last - first + 1)))


def not_found(sock, method):
    body = b"<Error><Code>NoSuchKey</Code><Message>hostile.py serves no such thing</Message></Error>"
    send_head(sock, 404, [("Content-Type", "application/xml"), ("Content-Length", len(body))])
    if method != "HEAD":
        sock.sendall(body)


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        STATE.count()
        sock = self.request
        sock.settimeout(max(1.0, STATE.left()))
        try:
            req = read_request(sock)
            if req is None:
                return
            method, path, query, headers = req
            parts = path.lstrip("/").split("/", 1)
            bucket, key = parts[0], parts[1] if len(parts) > 1 else ""
            if bucket in ("endless", "slowlist") and method == "GET" and not key:
                listing(sock, bucket, query, 0.2 if bucket == "slowlist" else 0)
            elif bucket == "hugehead":
                send_head(sock, 200, [("Content-Length", 10 ** 18)])
            elif bucket in ("drip", "huge", "long") and key and method == "HEAD":
                send_head(sock, 200, [("Content-Length", OBJECT_SIZE)])
            elif bucket in ("drip", "huge", "long") and key and method == "GET":
                {"drip": drip, "huge": huge, "long": long_body}[bucket](sock, headers)
            else:
                not_found(sock, method)
        except OSError:
            pass  # the client went away: what a deadline does


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    global STATE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lifetime", type=float, default=120)
    ap.add_argument("--max-requests", type=int, default=3000)
    args = ap.parse_args()
    STATE = State(min(args.lifetime, 600), args.max_requests)
    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(f"PORT {srv.server_address[1]}", flush=True)
    while STATE.left() > 0 and not STATE.done.is_set():
        STATE.done.wait(min(1.0, max(0.0, STATE.left())))
    srv.shutdown()
    srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
