#!/usr/bin/env python3
"""remote_servers_smoke: each test server answers, and each fault action of the proxy works.

Run by ctest with KS_REMOTE_ENV (fixture remote_servers). Standard library + the curl program.
"""

import http.client
import os
import socket
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import remote_env  # noqa: E402

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def hostport(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def request(base, method, path, body=None, headers=None, timeout=30):
    """One request on a fresh connection: (status, body bytes) or (None, exception name) on a
    transport error (closed connection, truncated body, timeout)."""
    host, port = hostport(base)
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    except (http.client.HTTPException, OSError) as e:
        return None, type(e).__name__
    finally:
        c.close()


def main():
    env = remote_env.load()
    http_url, proxy_http = env["KS_TEST_HTTP_URL"], env["KS_TEST_PROXY_HTTP"]
    root = env["KS_TEST_HTTP_ROOT"]
    for k in ("KS_TEST_S3_ENDPOINT", "KS_TEST_HTTP_URL", "KS_TEST_PROXY_S3", "KS_TEST_PROXY_HTTP",
              "KS_TEST_PROXY_CTL"):
        check(hostport(env[k])[0] == "127.0.0.1", f"{k} is on 127.0.0.1")
    remote_env.clear_faults()
    remote_env.clear_log()

    # nginx: static files with Range, directly and through the proxy
    blob = bytes((i * 7 + 3) % 251 for i in range(200_000))
    with open(os.path.join(root, "smoke.bin"), "wb") as f:
        f.write(blob)
    for name, base in (("nginx", http_url), ("proxy->nginx", proxy_http)):
        st, got = request(base, "GET", "/smoke.bin")
        check(st == 200 and got == blob, f"{name}: GET returns the file")
        st, got = request(base, "GET", "/smoke.bin", headers={"Range": "bytes=1000-1999"})
        check(st == 206 and got == blob[1000:2000], f"{name}: Range GET returns 206 and the bytes")
        st, _ = request(base, "GET", "/missing.bin")
        check(st == 404, f"{name}: a missing file is 404")

    # moto: buckets and objects, signed by curl, directly and through the proxy
    remote_env.make_bucket("smoke")
    for name, proxied in (("moto", False), ("proxy->moto", True)):
        key = f"smoke/obj-{int(proxied)}"
        rc, st, _ = remote_env.s3("PUT", key, data=blob, via_proxy=proxied)
        check(rc == 0 and st == 200, f"{name}: PUT object")
        rc, st, got = remote_env.s3("GET", key, via_proxy=proxied)
        check(rc == 0 and st == 200 and got == blob, f"{name}: GET returns the object")
        rc, st, got = remote_env.s3("GET", key, via_proxy=proxied, headers=["Range: bytes=10-19"])
        check(st == 206 and got == blob[10:20], f"{name}: Range GET of an object")
    check(remote_env.list_keys("smoke") == {"obj-0": len(blob), "obj-1": len(blob)},
          "moto lists both objects with their sizes")

    # status: 503 twice, then through
    remote_env.set_faults([{"target": "http", "method": "GET", "path_re": "^/smoke\\.bin$",
                            "action": "status", "status": 503, "times": 2}])
    got = [request(proxy_http, "GET", "/smoke.bin")[0] for _ in range(3)]
    check(got == [503, 503, 200], f"status rule: 503, 503 then 200 (got {got})")
    remote_env.clear_faults()

    # skip: the first request passes, the second gets 500, the third passes
    remote_env.set_faults([{"target": "http", "path_re": "smoke", "action": "status", "status": 500,
                            "skip": 1, "times": 1}])
    got = [request(proxy_http, "GET", "/smoke.bin")[0] for _ in range(3)]
    check(got == [200, 500, 200], f"skip rule: 200, 500 then 200 (got {got})")
    remote_env.clear_faults()

    # a rule for the other front does not apply
    remote_env.set_faults([{"target": "s3", "action": "status", "status": 500}])
    check(request(proxy_http, "GET", "/smoke.bin")[0] == 200, "an s3 rule leaves the http front alone")
    remote_env.clear_faults()

    # status on an upload: the object is not created
    remote_env.set_faults([{"target": "s3", "method": "PUT", "path_re": "/smoke/refused$",
                            "action": "status", "status": 500, "times": 1}])
    rc, st, _ = remote_env.s3("PUT", "smoke/refused", data=blob, via_proxy=True)
    check(st == 500, f"status rule on PUT answers 500 (got {st})")
    check("refused" not in remote_env.list_keys("smoke"), "the refused upload left no object")
    rc, st, _ = remote_env.s3("PUT", "smoke/refused", data=blob, via_proxy=True)
    check(rc == 0 and st == 200, "the retried upload succeeds")
    remote_env.clear_faults()

    # truncate, response phase: full Content-Length, fewer bytes, then close
    remote_env.set_faults([{"target": "http", "path_re": "smoke", "action": "truncate", "after_bytes": 5000,
                            "times": 1}])
    st, err = request(proxy_http, "GET", "/smoke.bin")
    check(st is None and err == "IncompleteRead", f"truncate rule cuts the body (got {st}, {err})")
    check(request(proxy_http, "GET", "/smoke.bin") == (200, blob), "after one truncation the body is whole")
    remote_env.clear_faults()

    # truncate / drop, request phase (an upload cut mid body): no object appears
    for action in ("truncate", "drop"):
        key = f"smoke/cut-{action}"
        remote_env.set_faults([{"target": "s3", "method": "PUT", "path_re": f"/{key}$", "action": action,
                                "after_bytes": 1000, "times": 1}])
        rc, st, _ = remote_env.s3("PUT", key, data=blob, via_proxy=True)
        check(rc != 0, f"{action} mid upload: the client sees the connection fail (curl {rc}, HTTP {st})")
        check(key[6:] not in remote_env.list_keys("smoke"), f"{action} mid upload: no object was created")
        remote_env.clear_faults()

    # drop, request phase on a GET: closed without an answer
    remote_env.set_faults([{"target": "http", "path_re": "smoke", "action": "drop", "phase": "request",
                            "times": 1}])
    st, err = request(proxy_http, "GET", "/smoke.bin")
    check(st is None, f"drop (request phase) closes without answering (got {st}, {err})")
    remote_env.clear_faults()

    # drop, response phase: the headers, then close
    remote_env.set_faults([{"target": "http", "path_re": "smoke", "action": "drop", "times": 1}])
    st, err = request(proxy_http, "GET", "/smoke.bin")
    check(st is None and err == "IncompleteRead", f"drop after the headers (got {st}, {err})")
    remote_env.clear_faults()

    # stall: a client with a short timeout gives up; one with a long timeout gets everything
    remote_env.set_faults([{"target": "http", "path_re": "smoke", "action": "stall", "stall_ms": 3000,
                            "after_bytes": 1000, "times": 1}])
    st, err = request(proxy_http, "GET", "/smoke.bin", timeout=0.5)
    check(st is None and err in ("TimeoutError", "timeout"), f"stall mid download times a client out ({st}, {err})")
    remote_env.clear_faults()
    remote_env.set_faults([{"target": "http", "path_re": "smoke", "action": "stall", "stall_ms": 200,
                            "times": 1}])
    check(request(proxy_http, "GET", "/smoke.bin", timeout=30) == (200, blob), "a short stall then the whole body")
    remote_env.clear_faults()
    remote_env.set_faults([{"target": "s3", "method": "PUT", "action": "stall", "stall_ms": 200,
                            "after_bytes": 1000, "times": 1}])
    rc, st, _ = remote_env.s3("PUT", "smoke/stalled", data=blob, via_proxy=True)
    rc2, st2, got = remote_env.s3("GET", "smoke/stalled")
    check(rc == 0 and st == 200 and got == blob, "a stall mid upload, then the whole object")
    remote_env.clear_faults()

    # the log records each request with its range, sizes, status and fault
    log = remote_env.proxy_log()
    ranged = [e for e in log if e["range"] == "bytes=1000-1999" and e["target"] == "http"]
    check(len(ranged) == 1 and ranged[0]["status"] == 206 and ranged[0]["resp_bytes"] == 1000,
          "the log has the ranged GET with status 206 and 1000 bytes")
    puts = [e for e in log if e["method"] == "PUT" and e["path"] == "/smoke/obj-1"]
    check(len(puts) == 1 and puts[0]["req_bytes"] == len(blob), "the log counts an upload's bytes")
    check(any(e["fault"] == "truncate/response" for e in log), "the log names the faults applied")

    # the control API refuses a bad rule
    host, port = hostport(env["KS_TEST_PROXY_CTL"])
    st, _ = request(env["KS_TEST_PROXY_CTL"], "POST", "/faults", body=b'[{"action":"explode"}]')
    check(st == 400, "a bad rule is refused with 400")
    check(remote_env.faults() == [], "no rule is left active")
    s = socket.create_connection((host, port), timeout=5)
    s.close()

    print(f"{len(FAILS)} failure(s)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
