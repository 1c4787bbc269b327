#!/usr/bin/env python3
"""A loopback HTTP/1.1 proxy that forwards to an upstream server and injects faults by rule.

Standard library only. One process serves several fronts, each forwarding to its own upstream:

    faultproxy.py --front s3=PORT:UPSTREAM_PORT --front http=PORT:UPSTREAM_PORT --control PORT

Everything listens on and connects to 127.0.0.1 only. The control API (on its own port):

    POST   /faults   a JSON list of rules, appended to the active ones (a single object is accepted too)
    GET    /faults   the active rules with their counters
    DELETE /faults   removes every rule
    GET    /log      a JSON list, one entry per request seen by a front: target, method, path, query,
                     range (the Range header or null), status (sent to the client, null when none was),
                     req_bytes (request body bytes received from the client), resp_bytes (response body
                     bytes sent to the client), fault (the action applied, or null)
    DELETE /log      empties the log

A rule (only "action" is required):

    {"target": "s3"|"http"|"any", "method": "PUT", "path_re": "regex", "query_re": "regex",
     "action": "status"|"stall"|"truncate"|"drop"|"strip", "status": 503, "stall_ms": 2000,
     "after_bytes": 1000, "phase": "request"|"response", "times": N, "skip": K, "headers": ["If-Match"]}

  - target: which front it applies to (default "any"); method: exact, case-insensitive (default any);
    path_re / query_re: re.search on the request path / query string (default: match all).
  - skip K: the first K matching requests pass untouched; then the rule applies `times` times
    (default: to every later match, a persistent fault). The first rule that applies wins.
  - phase: "request" acts on the upload (the request body), "response" on the download. The default
    is "request" when the request has a body, else "response".
  - status: answers `status` (default 503) with an S3-style XML error instead of forwarding
    (the request body is read first, unless the client waits on "Expect: 100-continue").
  - stall: waits stall_ms (default 2000) after `after_bytes` bytes of the request body (request phase)
    or of the response body (response phase; 0 = before the response headers), then goes on.
  - truncate: request phase: forwards only `after_bytes` (default 0) of the request body upstream,
    then closes both connections. Response phase: sends the headers unchanged (full Content-Length)
    and only `after_bytes` (default: half the body) bytes of the body, then closes.
  - drop: request phase: reads `after_bytes` (default 0) of the request body, then closes the client
    connection without forwarding or answering. Response phase: sends the response headers and
    `after_bytes` (default 0) body bytes, then closes.
  - strip: forwards the request without the request headers named in `headers` (case-insensitive),
    as a store that ignores them would see it (e.g. S3 conditional writes: If-None-Match, If-Match).
"""

import argparse
import json
import re
import socket
import socketserver
import sys
import threading
import time

CHUNK = 64 * 1024
MAX_HEADER = 64 * 1024


class Rule:
    def __init__(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("a rule is a JSON object")
        self.spec = dict(spec)
        self.target = spec.get("target", "any")
        if self.target not in ("s3", "http", "any"):
            raise ValueError("target must be s3, http or any")
        self.method = (spec.get("method") or "").upper() or None
        self.path_re = re.compile(spec.get("path_re") or "")
        self.query_re = re.compile(spec.get("query_re") or "")
        self.action = spec.get("action")
        if self.action not in ("status", "stall", "truncate", "drop", "strip"):
            raise ValueError("action must be status, stall, truncate, drop or strip")
        self.headers = [h.lower() for h in spec.get("headers", [])]
        if self.action == "strip" and (not self.headers or not all(isinstance(h, str) for h in self.headers)):
            raise ValueError("strip needs a list of header names")
        self.phase = spec.get("phase")
        if self.phase not in (None, "request", "response"):
            raise ValueError("phase must be request or response")
        self.status = int(spec.get("status", 503))
        self.stall_ms = int(spec.get("stall_ms", 2000))
        self.after_bytes = spec.get("after_bytes")
        if self.after_bytes is not None:
            self.after_bytes = int(self.after_bytes)
        self.times = spec.get("times")
        self.times = None if self.times is None else int(self.times)
        self.skip = int(spec.get("skip", 0))
        self.seen = 0
        self.applied = 0

    def matches(self, target, method, path, query):
        if self.target != "any" and self.target != target:
            return False
        if self.method and self.method != method.upper():
            return False
        return bool(self.path_re.search(path)) and bool(self.query_re.search(query))

    def take(self):
        """Counts a matching request; True when the rule applies to it (caller holds the lock)."""
        self.seen += 1
        if self.seen <= self.skip:
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        self.applied += 1
        return True

    def describe(self):
        d = dict(self.spec)
        d["seen"] = self.seen
        d["applied"] = self.applied
        return d


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.rules = []
        self.log = []

    def pick(self, target, method, path, query):
        with self.lock:
            for r in self.rules:
                if r.matches(target, method, path, query) and r.take():
                    return r
        return None

    def record(self, entry):
        with self.lock:
            self.log.append(entry)


class Dropped(Exception):
    """The proxy closes the client connection on purpose (a fault) or the peer went away."""


def read_head(f):
    """Reads a request or response head; returns (first line, [(name, value)]) or None at EOF."""
    line = f.readline(MAX_HEADER)
    while line in (b"\r\n", b"\n"):  # tolerate blank lines between requests
        line = f.readline(MAX_HEADER)
    if not line:
        return None
    first = line.decode("latin-1").rstrip("\r\n")
    headers = []
    total = len(line)
    while True:
        h = f.readline(MAX_HEADER)
        total += len(h)
        if not h or total > MAX_HEADER:
            raise Dropped("truncated or oversized header")
        if h in (b"\r\n", b"\n"):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return first, headers


def header(headers, name):
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def without(headers, *names):
    return [(k, v) for k, v in headers if k.lower() not in names]


def encode_head(first, headers):
    return (first + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")


class Body:
    """Streams a message body (Content-Length, chunked or until close) as raw bytes, counting payload."""

    def __init__(self, f, headers, until_close=False):
        self.f = f
        te = (header(headers, "transfer-encoding") or "").lower()
        self.chunked = "chunked" in te
        cl = header(headers, "content-length")
        self.remaining = int(cl) if (cl is not None and not self.chunked) else None
        self.until_close = until_close and not self.chunked and self.remaining is None
        if not self.chunked and self.remaining is None and not self.until_close:
            self.remaining = 0
        self.payload = 0
        self.done = False
        self._chunk_left = 0

    def length(self):
        return self.remaining if not self.chunked and not self.until_close else None

    def read(self, limit=CHUNK):
        """Returns (raw bytes to forward, payload bytes in them); b'' at the end."""
        if self.done:
            return b"", 0
        if self.until_close:
            data = self.f.read1(limit) if hasattr(self.f, "read1") else self.f.read(limit)
            if not data:
                self.done = True
            self.payload += len(data)
            return data, len(data)
        if not self.chunked:
            if self.remaining == 0:
                self.done = True
                return b"", 0
            data = self.f.read1(min(limit, self.remaining))
            if not data:
                raise Dropped("body cut short")
            self.remaining -= len(data)
            self.payload += len(data)
            return data, len(data)
        return self._read_chunked(limit)

    def _read_chunked(self, limit):
        if self._chunk_left == 0:
            line = self.f.readline(MAX_HEADER)
            if not line:
                raise Dropped("chunked body cut short")
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                trailer = b""
                while True:
                    t = self.f.readline(MAX_HEADER)
                    if not t:
                        raise Dropped("chunked trailer cut short")
                    trailer += t
                    if t in (b"\r\n", b"\n"):
                        break
                self.done = True
                return line + trailer, 0
            self._chunk_left = size
            data = self.f.read(min(limit, size))
            if len(data) < min(limit, size):
                raise Dropped("chunk cut short")
            self._chunk_left -= len(data)
            out = line + data
        else:
            data = self.f.read(min(limit, self._chunk_left))
            if not data:
                raise Dropped("chunk cut short")
            self._chunk_left -= len(data)
            out = data
        if self._chunk_left == 0:
            crlf = self.f.readline(MAX_HEADER)
            out += crlf
        self.payload += len(data)
        return out, len(data)


def error_body(target, status):
    if target == "s3":
        code = {500: "InternalError", 503: "SlowDown", 403: "AccessDenied", 404: "NoSuchKey"}.get(status, "InjectedFault")
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>fault injected by the test proxy</Message></Error>").encode()
    return f"fault injected by the test proxy: {status}\n".encode()


REASONS = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class Front(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port, target, upstream_port, state):
        self.target = target
        self.upstream_port = upstream_port
        self.state = state
        super().__init__(("127.0.0.1", port), FrontHandler)


class FrontHandler(socketserver.StreamRequestHandler):
    def handle(self):
        try:
            while self.one_request():
                pass
        except (Dropped, OSError, ValueError):
            pass

    def one_request(self):
        """Proxies one request; returns True when the client connection stays open."""
        head = read_head(self.rfile)
        if head is None:
            return False
        first, headers = head
        parts = first.split(" ")
        if len(parts) != 3:
            raise Dropped("bad request line")
        method, target_uri, version = parts
        path, _, query = target_uri.partition("?")
        srv = self.server
        entry = {"target": srv.target, "method": method, "path": path, "query": query,
                 "range": header(headers, "range"), "status": None, "req_bytes": 0,
                 "resp_bytes": 0, "fault": None}
        body = Body(self.rfile, headers)
        has_body = body.chunked or (body.length() or 0) > 0
        rule = srv.state.pick(srv.target, method, path, query)
        phase = None
        if rule is not None and rule.action == "strip":
            headers = without(headers, *rule.headers)
            entry["fault"] = "strip"
            rule = None
        if rule is not None:
            phase = rule.phase or ("request" if has_body else "response")
            entry["fault"] = rule.action + "/" + phase
        expect = (header(headers, "expect") or "").lower() == "100-continue"
        keep = header(headers, "connection") is None or header(headers, "connection").lower() != "close"
        try:
            if rule is not None and rule.action == "status":
                return self.answer_status(rule, body, expect, entry) and keep
            if expect:
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.wfile.flush()
            up = socket.create_connection(("127.0.0.1", srv.upstream_port), timeout=120)
            try:
                return self.forward(up, method, target_uri, version, headers, body, rule, phase, entry) and keep
            finally:
                up.close()
        finally:
            srv.state.record(entry)

    def answer_status(self, rule, body, expect, entry):
        if not expect:
            self.drain(body, entry)
        msg = error_body(self.server.target, rule.status)
        hs = [("Content-Type", "application/xml" if self.server.target == "s3" else "text/plain"),
              ("Content-Length", str(len(msg)))]
        if expect:
            hs.append(("Connection", "close"))
        self.wfile.write(encode_head(f"HTTP/1.1 {rule.status} {REASONS.get(rule.status, 'Fault')}", hs) + msg)
        self.wfile.flush()
        entry["status"] = rule.status
        entry["resp_bytes"] = len(msg)
        return not expect

    def drain(self, body, entry):
        while True:
            data, n = body.read()
            entry["req_bytes"] += n
            if not data:
                return

    def forward(self, up, method, target_uri, version, headers, body, rule, phase, entry):
        upf = up.makefile("rb")
        hs = without(headers, "expect", "connection", "keep-alive", "proxy-connection")
        hs.append(("Connection", "close"))
        up.sendall(encode_head(f"{method} {target_uri} HTTP/1.1", hs))
        self.send_request_body(up, body, rule if phase == "request" else None, entry)
        head = read_head(upf)
        if head is None:
            raise Dropped("upstream closed without answering")
        status_line, rhs = head
        status = int(status_line.split(" ")[1])
        while 100 <= status < 200:  # interim responses from upstream are not passed on
            head = read_head(upf)
            if head is None:
                raise Dropped("upstream closed without answering")
            status_line, rhs = head
            status = int(status_line.split(" ")[1])
        no_body = method == "HEAD" or status in (204, 304)
        rbody = Body(upf, rhs if not no_body else [("Content-Length", "0")], until_close=not no_body)
        out_hs = without(rhs, "connection", "keep-alive")
        if rbody.until_close:
            out_hs.append(("Connection", "close"))
        rrule = rule if phase == "response" else None
        if rrule is not None and rrule.action == "stall" and not rrule.after_bytes:
            time.sleep(rrule.stall_ms / 1000.0)
        self.wfile.write(encode_head(f"HTTP/1.1 {status_line.split(' ', 1)[1]}", out_hs))
        entry["status"] = status
        self.send_response_body(rbody, rrule, entry)
        self.wfile.flush()
        return not rbody.until_close

    def send_request_body(self, up, body, rule, entry):
        limit = None
        if rule is not None:
            limit = rule.after_bytes or 0
        stalled = False
        while True:
            want = CHUNK if limit is None else max(1, min(CHUNK, limit - entry["req_bytes"]))
            if limit is not None and entry["req_bytes"] >= limit:
                if rule.action == "stall" and not stalled:
                    stalled = True
                    time.sleep(rule.stall_ms / 1000.0)
                    limit = None
                    continue
                if rule.action == "drop":
                    raise Dropped("fault: drop during the request body")
                if rule.action == "truncate":
                    raise Dropped("fault: request body truncated")
            data, n = body.read(want)
            entry["req_bytes"] += n
            if data:
                up.sendall(data)
            if not data or body.done:
                if limit is not None and rule.action in ("drop", "truncate"):
                    raise Dropped("fault: request cut at its end")
                if limit is not None and rule.action == "stall" and not stalled:
                    time.sleep(rule.stall_ms / 1000.0)
                return

    def send_response_body(self, rbody, rule, entry):
        limit = None
        if rule is not None and rule.action != "status":
            if rule.action == "truncate" and rule.after_bytes is None:
                total = rbody.length()
                limit = (total // 2) if total else 0
            elif rule.action == "stall" and not rule.after_bytes:
                limit = None  # already stalled before the headers
            else:
                limit = rule.after_bytes or 0
        while True:
            if limit is not None and entry["resp_bytes"] >= limit:
                if rule.action == "stall":
                    self.wfile.flush()
                    time.sleep(rule.stall_ms / 1000.0)
                    limit = None
                    continue
                self.wfile.flush()
                raise Dropped("fault: response cut")
            want = CHUNK if limit is None else max(1, min(CHUNK, limit - entry["resp_bytes"]))
            data, n = rbody.read(want)
            if not data:
                return
            self.wfile.write(data)
            entry["resp_bytes"] += n


class Control(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port, state):
        self.state = state
        super().__init__(("127.0.0.1", port), ControlHandler)


class ControlHandler(socketserver.StreamRequestHandler):
    def handle(self):
        try:
            while self.one():
                pass
        except (Dropped, OSError, ValueError):
            pass

    def reply(self, status, obj):
        data = (json.dumps(obj) + "\n").encode()
        self.wfile.write(encode_head(f"HTTP/1.1 {status} {'OK' if status < 300 else 'Error'}",
                                     [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(data)))]) + data)
        self.wfile.flush()

    def one(self):
        head = read_head(self.rfile)
        if head is None:
            return False
        first, headers = head
        method, uri = first.split(" ")[:2]
        path = uri.split("?")[0].rstrip("/")
        body = Body(self.rfile, headers)
        raw = b""
        while True:
            data, _ = body.read()
            if not data:
                break
            raw += data
        st = self.server.state
        if path == "/faults" and method == "POST":
            try:
                spec = json.loads(raw or b"[]")
                rules = [Rule(s) for s in (spec if isinstance(spec, list) else [spec])]
            except (ValueError, TypeError, re.error) as e:
                self.reply(400, {"error": str(e)})
                return True
            with st.lock:
                st.rules.extend(rules)
                n = len(st.rules)
            self.reply(200, {"rules": n})
        elif path == "/faults" and method == "DELETE":
            with st.lock:
                st.rules = []
            self.reply(200, {"rules": 0})
        elif path == "/faults" and method == "GET":
            with st.lock:
                self.reply(200, [r.describe() for r in st.rules])
        elif path == "/log" and method == "GET":
            with st.lock:
                log = list(st.log)
            self.reply(200, log)
        elif path == "/log" and method == "DELETE":
            with st.lock:
                st.log = []
            self.reply(200, [])
        else:
            self.reply(404, {"error": f"no such control endpoint: {method} {path}"})
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--front", action="append", default=[], metavar="TARGET=PORT:UPSTREAM_PORT",
                    help="a front named s3 or http on PORT forwarding to 127.0.0.1:UPSTREAM_PORT")
    ap.add_argument("--control", type=int, required=True, metavar="PORT")
    args = ap.parse_args()
    state = State()
    servers = []
    for f in args.front:
        name, _, ports = f.partition("=")
        port, _, upstream = ports.partition(":")
        if name not in ("s3", "http") or not port or not upstream:
            ap.error(f"bad --front {f!r}")
        servers.append(Front(int(port), name, int(upstream), state))
    servers.append(Control(args.control, state))
    for s in servers[:-1]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        servers[-1].serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
