#!/usr/bin/env python3
"""Hostile inputs for every command of the keepsake CLI, generated here, one
family of issue 9 at a time, each as a family of sizes/depths (not one input).

  hostile.py KEEPSAKE WORKDIR [--measure] [--write-corpus DIR]

Every case runs one command and checks: no signal, finished within 10 s, the
exit status, and an exact part of the message. With --measure each command
also runs under /usr/bin/time and its peak RSS is printed (never asserted).
--write-corpus writes the pickle programs into DIR/pickle (for the replayed
fuzz corpora). Standard library only: runs under any python3.
"""
import os
import stat
import struct
import subprocess
import sys
import time
import zipfile

HANG_S = 10

# ---------------------------------------------------------------- pickle bytes
PROTO = b"\x80\x02"
STOP = b"."
MARK, TUPLE, NONE, EMPTY_DICT, EMPTY_LIST = b"(", b"t", b"N", b"}", b"]"
SETITEM, APPEND, APPENDS, REDUCE, NEWFALSE, POP = b"s", b"a", b"e", b"R", b"\x89", b"0"


def glob(mod, name):
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def ustr(s):
    b = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def pint(v):
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if -(2 ** 31) <= v < 2 ** 31:
        return b"J" + struct.pack("<i", v)
    n = (v.bit_length() + 8) // 8
    head = b"\x8a" + bytes([n]) if n < 256 else b"\x8b" + struct.pack("<I", n)
    return head + v.to_bytes(n, "little", signed=True)


def put(i):
    return b"r" + struct.pack("<I", i)


def get(i):
    return b"j" + struct.pack("<I", i)


def tup(*items):
    return MARK + b"".join(items) + TUPLE


def storage(key, cls="FloatStorage", numel=4):
    pid = tup(ustr("storage"), glob("torch", cls), ustr(key), ustr("cpu"), pint(numel))
    return pid + b"Q"


def tensor(key, cls, numel, offset, shape, stride):
    args = tup(storage(key, cls, numel), pint(offset), tup(*map(pint, shape)), tup(*map(pint, stride)),
               NEWFALSE, glob("collections", "OrderedDict") + b")" + REDUCE)
    return glob("torch._utils", "_rebuild_tensor_v2") + args + REDUCE


def dict_of(pairs):
    return EMPTY_DICT + b"".join(ustr(k) + v + SETITEM for k, v in pairs)


def archive(path, pkl, storages=None):
    """A torch.save-style zip: stored entries under archive/."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for key, data in (storages or {}).items():
            z.writestr("archive/data/" + key, data)
        z.writestr("archive/version", "3\n")
    return path


# ---------------------------------------------------------------- safetensors
def safetensors(path, tensors, meta=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    import json
    hdr, off, data = {}, 0, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    return path


# ---------------------------------------------------------------- runner
class Runner:
    def __init__(self, ks, work, measure):
        self.ks, self.work, self.measure = ks, work, measure
        self.failures, self.count, self.peaks = [], 0, []

    def p(self, name):
        return os.path.join(self.work, name)

    def run(self, label, args, rc, text, stdout_only=False, absent=None, stdin=None, small_stack=False):
        self.count += 1
        cmd = [self.ks] + args
        t0 = time.monotonic()
        pre = small_stack_1mib if small_stack else None
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=HANG_S, stdin=stdin, preexec_fn=pre)
        except subprocess.TimeoutExpired:
            self.failures.append(f"{label}: hang (> {HANG_S} s)")
            return
        took = time.monotonic() - t0
        out = (r.stdout + b"\n" + r.stderr).decode("utf-8", "replace")
        if stdout_only:
            out = r.stdout.decode("utf-8", "replace")
        if r.returncode < 0:
            self.failures.append(f"{label}: killed by signal {-r.returncode}")
        elif r.returncode != rc:
            self.failures.append(f"{label}: exit {r.returncode}, expected {rc}: {out.strip()[:400]}")
        elif not any(t in out for t in (text if isinstance(text, tuple) else (text,))):
            self.failures.append(f"{label}: message lacks {text!r}: {out.strip()[:400]}")
        elif absent is not None and absent(out):
            self.failures.append(f"{label}: output has what it must not: {out.strip()[:400]}")
        if self.measure:
            t = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, timeout=60, stdin=stdin)
            kb = int(t.stderr.decode().strip().splitlines()[-1])
            self.peaks.append((kb, took, label))
            print(f"  {kb / 1024:7.1f} MiB {took:6.2f} s  {label}")


def small_stack_1mib():
    """Nesting cases run with a 1 MiB stack: recursion per level would need far more."""
    import resource
    resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, 1 << 20))


# ---------------------------------------------------------------- families
def fam1_recursion(R, corpus):
    """Nesting: _rebuild_from_type_v2 chains (iterative now), dicts and lists (depth limit), marks."""
    from_type = glob("torch._tensor", "_rebuild_from_type_v2")
    inner_tensor = tensor("0", "FloatStorage", 4, 0, [4], [1])
    for depth in (1, 64, 1000, 10000, 80000):
        # from_type(from_type, None, (from_type, None, (... (_rebuild_tensor_v2, None, args, None) ...), None), None)
        body = from_type + put(0) + POP
        body += (MARK + get(0) + NONE) * depth
        body += tup(glob("torch._utils", "_rebuild_tensor_v2"), NONE,
                    tup(storage("0"), pint(0), tup(pint(4)), tup(pint(1)), NEWFALSE, EMPTY_DICT), NONE)[:-1] + TUPLE
        body += (NONE + TUPLE) * depth
        pkl = PROTO + from_type + body + REDUCE + STOP
        # the outermost REDUCE takes the outer tuple as args: (from_type, None, inner, None)
        path = archive(R.p(f"from_type_{depth}.pt"), pkl, {"0": b"\0" * 16})
        R.run(f"1 from_type nested {depth}", ["convert", path, R.p("f1.keepsake")], 0, "1 entries", small_stack=True)
        if corpus and depth <= 10000:
            corpus(f"from_type_{depth}", pkl)
    del inner_tensor
    # flattening refuses what is too deep for a name, whichever limit comes first (a deep list of lists
    # takes more than the pickle machine's memory budget of 16 bytes per pickle byte before that)
    too_deep = ("nesting deeper than", "key longer than", "bytes of memory")
    for depth in (10, 63, 1000, 10000, 100000):
        pkl = PROTO + (EMPTY_DICT + ustr("k")) * depth + NONE + SETITEM * depth + STOP
        path = archive(R.p(f"dict_{depth}.pt"), pkl)
        ok = depth < 64
        R.run(f"1 dict nested {depth}", ["convert", path, R.p("f1.keepsake")], 0 if ok else 1,
              "1 entries" if ok else too_deep, small_stack=True)
        if corpus and depth == 1000:
            corpus(f"dict_nested_{depth}", pkl)
    for depth in (1000, 200000):
        pkl = PROTO + MARK * depth + NONE + b"l" * depth + STOP
        path = archive(R.p(f"list_{depth}.pt"), pkl)
        R.run(f"1 list nested {depth}", ["convert", path, R.p("f1.keepsake")], 1, too_deep, small_stack=True)
    pkl = PROTO + MARK * ((1 << 20) + 1) + STOP
    R.run("1 marks 2^20+1", ["convert", archive(R.p("marks.pt"), pkl), R.p("f1.keepsake")], 1,
          "stack deeper than 1048576")


def fam2_wrap(R, corpus):
    """Sizes near 2^64: view budgets and storage byte counts must not wrap."""
    first = tensor("0", "ByteStorage", 16, 0, [4, 4], [1, 4])  # transposed: 16 bytes materialised
    for k in (4, 8, 16, 20, 1 << 20):
        rows = ((1 << 64) - k) // 4
        if rows >= 1 << 63:
            continue
        big = tensor("0", "ByteStorage", 16, 0, [rows, 4], [0, 0])
        pkl = PROTO + dict_of([("a", first), ("b", big)]) + STOP
        path = archive(R.p(f"view_wrap_{k}.pt"), pkl, {"0": bytes(range(16))})
        R.run(f"2 view of 2^64-{k} bytes after 16", ["convert", path, R.p("f2.keepsake")], 1,
              "materialised views exceed")
        if corpus and k == 16:
            corpus("view_wrap_16", pkl)
    for cls, numel in (("FloatStorage", 1 << 62), ("DoubleStorage", (1 << 61) + 1), ("LongStorage", (1 << 63) - 1)):
        pkl = PROTO + dict_of([("t", tensor("0", cls, numel, 0, [1], [1]))]) + STOP
        path = archive(R.p(f"storage_{cls}.pt"), pkl, {"0": b"\0" * 64})
        R.run(f"2 storage {cls} of {numel}", ["convert", path, R.p("f2.keepsake")], 1,
              f"storage of {numel} ")
        if corpus and cls == "FloatStorage":
            corpus("storage_numel_2p62", pkl)
    # a shape whose byte count overflows
    pkl = PROTO + dict_of([("t", tensor("0", "FloatStorage", 4, 0, [1 << 62, 4], [0, 0]))]) + STOP
    R.run("2 shape bytes overflow", ["convert", archive(R.p("shape_ovf.pt"), pkl, {"0": b"\0" * 16}),
                                     R.p("f2.keepsake")], 1, "tensor shape overflows")


def fam3_cpu(R, corpus):
    """Cost: one memoised big integer referenced many times; copies of a memoised list."""
    for nbytes, refs in ((9, 1), (512, 4096), (4096, 256), (4096, 2048)):
        big = (1 << (8 * nbytes - 2)) + 12345
        pkl = PROTO + EMPTY_LIST + MARK + pint(big) + put(1) + (get(1)) * (refs - 1) + APPENDS + STOP
        path = archive(R.p(f"bigint_{nbytes}_{refs}.pt"), pkl)
        R.run(f"3 bigint {nbytes} B x {refs} refs", ["convert", path, R.p("f3.keepsake")], 0, f"{refs} entries")
        if corpus and refs == 4096:
            corpus("bigint_512x4096", pkl)
    # under 1 KB: a 560-byte integer reached through a DAG of lists (2^levels paths); was 9 s of CPU
    for levels in (6, 10, 13):
        pkl = PROTO + pint((1 << (8 * 560 - 2)) + 1) + put(0) + POP
        for i in range(levels):
            pkl += EMPTY_LIST + MARK + get(i) + get(i) + APPENDS + put(i + 1) + POP
        pkl += get(levels) + STOP
        path = archive(R.p(f"bigint_dag_{levels}.pt"), pkl)
        R.run(f"3 bigint via a DAG of {levels} levels ({len(pkl)} B)", ["convert", path, R.p("f3.keepsake")], 0,
              f"{1 << levels} entries")
        if corpus and levels == 13:
            corpus("bigint_dag_13", pkl)
    # the decimal text is right (checked on the smallest)
    path = archive(R.p("bigint_exact.pt"), PROTO + dict_of([("v", pint(-(10 ** 40) - 7))]) + STOP)
    R.run("3 bigint decimal text", ["convert", path, R.p("f3b.keepsake")], 0, "1 entries")
    R.run("3 bigint decimal shown", ["inspect", R.p("f3b.keepsake")], 0, '"-10000000000000000000000000000000000000007"')
    path = archive(R.p("bigint_long.pt"), PROTO + dict_of([("v", pint(1 << (8 * 5000 - 2)))]) + STOP)
    R.run("3 bigint of 5000 bytes", ["convert", path, R.p("f3.keepsake")], 1, "integer of 5000 bytes is longer than 4096")
    # BINPERSID of one 1 MiB storage, 20000 times, through convert (which checks zip CRC32s): each reference
    # checked the whole entry again (22 s); now an entry is checked on its first read
    pid = tup(ustr("storage"), glob("torch", "ByteStorage"), ustr("0"), ustr("cpu"), pint(1 << 20))
    pkl = PROTO + pid + put(0) + POP + (get(0) + b"Q" + POP) * 20000 + NONE + STOP
    path = archive(R.p("persid_crc.pt"), pkl, {"0": bytes(1 << 20)})
    R.run("3 BINPERSID of a 1 MiB storage x 20000", ["convert", path, R.p("f3.keepsake")], 0, "1 entries")
    for items, copies in ((2000, 2000), (20000, 5000)):
        pkl = PROTO + MARK + NONE * items + b"l" + put(0) + POP
        pkl += (glob("builtins", "set") + tup(get(0)) + REDUCE + POP) * copies + NONE + STOP
        path = archive(R.p(f"copies_{items}_{copies}.pt"), pkl)
        R.run(f"3 set() of a {items}-item list x {copies}", ["convert", path, R.p("f3.keepsake")], 1,
              ("program costs more than", "bytes of memory"))
        if corpus and items == 2000:
            corpus("set_copies_2000", pkl)


def keepsake_file(R, name, tensors):
    """A real keepsake file: a .pt converted by the CLI."""
    pt = archive(R.p(name + ".pt"), PROTO + dict_of(tensors) + STOP, {"0": bytes(range(256)) * 4})
    out = R.p(name + ".keepsake")
    subprocess.run([R.ks, "convert", pt, out], check=True, capture_output=True)
    return out


def flip_last_data_byte(path):
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 1]))


def template(k, p, a, b, c, d):
    """A fuzz template (tests/fuzz/expand.h): P + A*2^k + B + C*2^k + D."""
    assert max(map(len, (p, a, b, c))) < 256
    return bytes([0xFE, k, len(p), len(a), len(b), len(c)]) + p + a + b + c + d


def templates():
    """Seeds that let the fuzzers start from the depth and size limits."""
    from_type = glob("torch._tensor", "_rebuild_from_type_v2")
    innermost = tup(glob("torch._utils", "_rebuild_tensor_v2"), NONE,
                    tup(storage("0"), pint(0), tup(pint(4)), tup(pint(1)), NEWFALSE, EMPTY_DICT), NONE)
    yield "tpl-from-type-131072", template(17, PROTO + from_type + from_type + put(0) + POP, MARK + get(0) + NONE,
                                           innermost, NONE + TUPLE, REDUCE + STOP)
    yield "tpl-dict-65536", template(16, PROTO, EMPTY_DICT + ustr("k"), NONE, SETITEM, STOP)
    yield "tpl-list-131072", template(17, PROTO, MARK, NONE, b"l", STOP)
    yield "tpl-marks-131072", template(17, PROTO, MARK * 8, b"", b"", STOP)
    yield "tpl-bigint-refs", template(14, PROTO + EMPTY_LIST + MARK + pint((1 << 1900) + 1) + put(1), get(1), b"",
                                      b"", APPENDS + STOP)
    yield "tpl-set-copies", template(12, PROTO + MARK + NONE * 200 + b"l" + put(0) + POP,
                                     glob("builtins", "set") + tup(get(0)) + REDUCE + POP, NONE, b"", STOP)


def fam8_laundering(R):
    """convert checks its input: keepsake checksums and zip CRCs; --salvage says what it salvaged."""
    for n in (1, 3):
        src = keepsake_file(R, f"good{n}", [(f"t{i}", tensor("0", "FloatStorage", 256, 0, [4], [1])) for i in range(n)])
        flip_last_data_byte(src)
        R.run(f"8 convert flipped bit ({n} tensors)", ["convert", src, R.p("f8.keepsake")], 1, "checksum")
        R.run(f"8 verify flipped bit ({n} tensors)", ["verify", src], 1, "BAD")
        R.run(f"8 convert --salvage flipped bit ({n} tensors)", ["convert", "--salvage", src, R.p("f8s.keepsake")], 0,
              "salvaged despite:")
    pkl = PROTO + dict_of([("w", tensor("0", "FloatStorage", 4, 0, [4], [1]))]) + STOP
    path = archive(R.p("badcrc.pt"), pkl, {"0": b"\1" * 16})
    raw = bytearray(open(path, "rb").read())
    i = raw.find(b"\1" * 16)
    raw[i] ^= 0x80  # data changes, recorded CRC does not
    open(path, "wb").write(raw)
    R.run("8 convert zip with a bad CRC", ["convert", path, R.p("f8.keepsake")], 1, "CRC")
    R.run("8 convert --salvage zip with a bad CRC", ["convert", "--salvage", path, R.p("f8s.keepsake")], 0,
          "salvaged despite:")


def fam9_output(R):
    """OUT that exists and is not a writable regular file is refused and left alone."""
    src = keepsake_file(R, "src9", [("w", tensor("0", "FloatStorage", 4, 0, [4], [1]))])
    link = R.p("link.keepsake")
    target = R.p("link-target")
    open(target, "w").write("keep me")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)
    fifo = R.p("fifo.keepsake")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    d = R.p("dir.keepsake")
    os.makedirs(d, exist_ok=True)
    # a character device of our own (never /dev/null: a broken build would replace it)
    dev = R.p("chardev.keepsake")
    if not os.path.lexists(dev):
        try:
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError:
            dev = None  # not permitted here: that case is skipped
    ro = R.p("readonly.keepsake")
    if os.path.exists(ro):
        os.chmod(ro, 0o644)
    open(ro, "w").write("keep me")
    os.chmod(ro, 0o444)
    ptlink = R.p("link.pt")
    if not os.path.lexists(ptlink):
        os.symlink(target, ptlink)
    cases = [(link, "a symbolic link"), (ptlink, "a symbolic link"), (fifo, "a FIFO"), (d, "a directory"), (ro, "a read-only file")]
    if dev:
        cases.append((dev, "a character device"))
    for out, what in cases:
        R.run(f"9 convert to {what}", ["convert", src, out], 1, f"output exists and is {what}")
    kept = open(target, "rb").read() == b"keep me" and open(ro, "rb").read() == b"keep me"
    kept = kept and os.path.islink(link) and stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.isdir(d)
    if not kept or (dev and not stat.S_ISCHR(os.lstat(dev).st_mode)):
        R.failures.append("9: a refused output was modified")
    os.chmod(ro, 0o644)


def fam10_terminal(R):
    """Control characters from names and metadata never reach the terminal raw."""
    evil = [("a\x1b[31mred\x07", tensor("0", "FloatStorage", 4, 0, [4], [1])),
            ("b\r\u009b2J\u202e", tensor("0", "FloatStorage", 4, 0, [4], [1])),
            ("x\n" + R.p("forged.keepsake") + ": OK (keepsake format 1, 1 tensors)", tensor("0", "FloatStorage", 4, 0, [4], [1]))]
    src = keepsake_file(R, "evil", evil)

    def raw_controls(out):
        lines = out.split("\n")
        return any(c in out for c in "\x1b\x07\r\u009b\u202e") or any(l.startswith(R.p("forged")) for l in lines)

    plain = keepsake_file(R, "plain", evil[:1])
    for cmd, rc, text in ((["inspect", src], 0, "\\x1B[31mred\\x07"), (["verify", src], 0, ": OK ("),
                          (["diff", src, plain], 1, "b\\x0D\\u009B2J\\u202E"),
                          (["convert", src, R.p("evil2.keepsake")], 0, "3 entries")):
        R.run(f"10 {cmd[0]} escapes names", cmd, rc, text, absent=raw_controls)
    flip_last_data_byte(src)
    R.run("10 verify cannot forge an OK line", ["verify", src], 1, "BAD", absent=raw_controls)
    R.run("10 inspect --json keeps names exact", ["inspect", "--json", R.p("evil2.keepsake")], 0,
          ("\\u001b[31mred\\u0007", "\\u001B[31mred\\u0007"))
    # every control character a terminal acts on, in names, metadata keys and values
    controls = [chr(c) for c in range(1, 32)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)] + \
               [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)]
    tens = [(f"n{i:03d}{c}end", "U8", [1], b"\0") for i, c in enumerate(controls)]
    meta = {f"m{i:03d}{c}": f"v{c}" for i, c in enumerate(controls)}
    allc = safetensors(R.p("all-controls.safetensors"), tens, meta)

    def any_control(out):
        return any(c in out for c in controls if c != "\n") or any(
            l.strip().startswith("end") for l in out.split("\n"))

    R.run(f"10 inspect escapes all {len(controls)} control characters", ["inspect", allc], 0, "n008\\x09end",
          absent=any_control)
    R.run(f"10 diff escapes all {len(controls)} control characters", ["diff", allc, plain], 1, "n009\\x0Aend",
          absent=any_control)
    st = safetensors(R.p("meta.safetensors"), [("t", "F32", [1], b"\0" * 4)], {"k\x1b]0;title\x07": "v\x1b[2J\r"})
    R.run("10 inspect escapes metadata", ["inspect", st], 0, "k\\x1B]0;title\\x07: v\\x1B[2J\\x0D", absent=raw_controls)


def fam13_small(R):
    """FIFO inputs, stdout errors, temp file names, stale temp files."""
    fifo = R.p("vectors.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    R.run("13 eval-vectors on a FIFO", ["eval-vectors", fifo], 1, "not a regular file")
    for cmd in ("verify", "inspect", "convert"):
        R.run(f"13 {cmd} on a FIFO", [cmd, fifo] + ([R.p("f13.keepsake")] if cmd == "convert" else []), 1,
              "not a regular file" if cmd == "convert" else "")
    src = keepsake_file(R, "src13", [("w", tensor("0", "FloatStorage", 4, 0, [4], [1]))])
    with open("/dev/full", "w") as full:
        for cmd in (["inspect", src], ["inspect", "--json", src], ["verify", src], ["diff", src, src], ["--help"]):
            R.count += 1
            r = subprocess.run([R.ks] + cmd, stdout=full, stderr=subprocess.PIPE, timeout=HANG_S)
            if r.returncode != 2 or b"cannot write output" not in r.stderr:
                R.failures.append(f"13 {cmd[0]} > /dev/full: exit {r.returncode}: {r.stderr[:200]!r}")
    R.run("13 temp file named when it cannot be created", ["convert", src, R.p("no-such-dir/out.keepsake")], 1,
          "cannot create temporary file '" + R.p("no-such-dir/.out.keepsake.tmp-"))
    # stale temp files: old and unlocked go; fresh, locked, or not ours stay
    import fcntl
    d = R.p("stale")
    os.makedirs(d, exist_ok=True)
    old = time.time() - 3600
    names = {".out.keepsake.tmp-AAAAAA": True, ".other.pt.tmp-BBBBBB": True, ".out.keepsake.tmp-fresh1": False,
             ".out.keepsake.tmp-LOCKED": False, ".out.keepsake.tmp-toolong7": False, "out.keepsake.tmp-CCCCCC": False}
    for n in names:
        open(os.path.join(d, n), "w").write("x" * 100)
        if n != ".out.keepsake.tmp-fresh1":
            os.utime(os.path.join(d, n), (old, old))
    held = open(os.path.join(d, ".out.keepsake.tmp-LOCKED"))
    fcntl.flock(held, fcntl.LOCK_EX)
    R.run("13 convert cleans stale temp files", ["convert", src, os.path.join(d, "out.keepsake")], 0, "1 entries")
    for n, gone in names.items():
        if os.path.exists(os.path.join(d, n)) == gone:
            R.failures.append(f"13 stale cleanup: {n} {'left behind' if gone else 'removed'}")
    held.close()


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    measure = "--measure" in sys.argv
    corpus_dir = None
    if "--write-corpus" in sys.argv:
        corpus_dir = sys.argv[sys.argv.index("--write-corpus") + 1]
        args.remove(corpus_dir)
    ks, work = os.path.abspath(args[0]), os.path.abspath(args[1])
    os.makedirs(work, exist_ok=True)
    R = Runner(ks, work, measure)

    def corpus(name, pkl):
        if corpus_dir:
            for t in ("pickle", "torch"):
                os.makedirs(os.path.join(corpus_dir, t), exist_ok=True)
                open(os.path.join(corpus_dir, t, "hostile-" + name), "wb").write(pkl)

    if corpus_dir:
        for name, tpl in templates():
            corpus(name, tpl)
    for fam in (fam1_recursion, fam2_wrap, fam3_cpu):
        fam(R, corpus)
    for fam in (fam8_laundering, fam9_output, fam10_terminal, fam13_small):
        fam(R)
    if measure and R.peaks:
        kb, took, label = max(R.peaks)
        print(f"peak RSS {kb / 1024:.1f} MiB ({label}); slowest {max(p[1] for p in R.peaks):.2f} s")
    for f in R.failures:
        print("FAIL", f)
    print(f"{R.count - len(R.failures)} of {R.count} hostile cases passed")
    return 1 if R.failures else 0


if __name__ == "__main__":
    sys.exit(main())
