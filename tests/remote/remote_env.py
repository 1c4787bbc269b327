"""Helpers for Python tests that use the remote test servers (ctest fixture remote_servers).

    import remote_env                      # tests/remote on sys.path
    env = remote_env.load()                # reads $KS_REMOTE_ENV into os.environ, returns the dict
    remote_env.make_bucket("b1")           # through moto directly
    remote_env.s3("PUT", "b1/key", data=b"...", via_proxy=True)
    remote_env.set_faults([{"target": "s3", "method": "PUT", "action": "status", "status": 503, "times": 2}])
    remote_env.clear_faults(); remote_env.proxy_log(); remote_env.settled_log(); remote_env.clear_log()

Standard library only. S3 requests are signed by the curl program (--aws-sigv4): moto refuses
unsigned reads of private objects.
"""

import json
import os
import subprocess
import time
import urllib.request

ENV_KEYS = ("KS_TEST_S3_ENDPOINT", "KS_TEST_HTTP_URL", "KS_TEST_HTTP_ROOT", "KS_TEST_PROXY_S3",
            "KS_TEST_PROXY_HTTP", "KS_TEST_PROXY_CTL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION")


def load(path=None):
    """Reads servers.env (default: $KS_REMOTE_ENV) into os.environ; returns the KEY -> VALUE dict."""
    path = path or os.environ.get("KS_REMOTE_ENV")
    if not path:
        raise RuntimeError("KS_REMOTE_ENV is not set: run this test through ctest (fixture remote_servers)")
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, _, v = line.partition("=")
                env[k] = v
    missing = [k for k in ENV_KEYS if k not in env]
    if missing:
        raise RuntimeError(f"{path} lacks {', '.join(missing)}")
    os.environ.update(env)
    return env


def _ctl(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(os.environ["KS_TEST_PROXY_CTL"] + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def set_faults(rules):
    """Adds fault rules (a list of dicts, see faultproxy.py) to the proxy."""
    return _ctl("POST", "/faults", rules)


def clear_faults():
    return _ctl("DELETE", "/faults")


def faults():
    return _ctl("GET", "/faults")


def proxy_log():
    """The proxy's request log: a list of dicts (target, method, path, query, range, status, ...)."""
    return _ctl("GET", "/log")


def settled_log(start=0):
    """The proxy's log from entry `start` on, once it stops growing (an entry is recorded when its
    exchange ends, which may be a moment after the client has its bytes); at most about 10 s."""
    last, stable_since = None, time.monotonic()
    deadline = time.monotonic() + 10
    while True:
        log = proxy_log()
        if last is not None and len(log) == len(last):
            if time.monotonic() - stable_since > 0.3 or time.monotonic() > deadline:
                return log[start:]
        else:
            stable_since = time.monotonic()
        last = log
        time.sleep(0.1)


def clear_log():
    return _ctl("DELETE", "/log")


def s3(method, key, data=None, via_proxy=False, headers=None, timeout=60):
    """A signed S3 request on "bucket[/key][?query]"; returns (curl exit code, HTTP status, body bytes)."""
    base = os.environ["KS_TEST_PROXY_S3" if via_proxy else "KS_TEST_S3_ENDPOINT"]
    region = os.environ.get("AWS_REGION", "us-east-1")
    argv = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", str(timeout),
            "--aws-sigv4", f"aws:amz:{region}:s3",
            "--user", f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
            "-X", method, "-H", "Content-Type: application/octet-stream"]
    for h in headers or ():
        argv += ["-H", h]
    if data is not None:
        argv += ["--data-binary", "@-"]
    argv.append(f"{base}/{key}")
    p = subprocess.run(argv, input=data, capture_output=True)
    out, _, code = p.stdout.rpartition(b"\n")
    return p.returncode, int(code or b"0"), out


def make_bucket(name):
    """Creates a bucket in moto (an existing one is fine)."""
    rc, status, body = s3("PUT", name)
    if rc != 0 or status not in (200, 409):
        raise RuntimeError(f"cannot create bucket {name}: curl {rc}, HTTP {status}: {body[:200]!r}")


def list_keys(bucket, prefix=""):
    """Keys (with sizes) under prefix, from moto directly: {key: size}."""
    import re
    rc, status, body = s3("GET", f"{bucket}?list-type=2&prefix={prefix}")
    if rc != 0 or status != 200:
        raise RuntimeError(f"cannot list {bucket}/{prefix}: curl {rc}, HTTP {status}")
    text = body.decode()
    keys = re.findall(r"<Key>([^<]*)</Key>", text)
    sizes = [int(s) for s in re.findall(r"<Size>(\d+)</Size>", text)]
    return dict(zip(keys, sizes))
