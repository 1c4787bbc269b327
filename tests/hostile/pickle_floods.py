#!/usr/bin/env python3
"""Opcode floods: the pickle reader's peak memory against the size of its input.

  pickle_floods.py KEEPSAKE WORKDIR [--mib=N] [--only=NAME,...] [--list] [--no-assert]

Each flood repeats one allocating opcode of src/torch/pickle.c's table (one that
makes a node, a string, an item, a stack, mark or memo slot, or a copy through a
known constructor) until the pickle is about N MiB (default 2), and runs it
through both import paths of `keepsake convert`: as the data.pkl of a torch.save
archive (.pt) and as the .metadata of a torch.distributed.checkpoint directory.
Each run's peak RSS and time come from /usr/bin/time (a child of Python would
report Python's own RSS as its peak). The test asserts, for each run, no signal,
no hang, exit status 0 or 1, and

  every flood:  peak RSS <= E + 18 x B + 4 MiB, and for floods marked `limit`,
                refused by the pickle machine's memory budget (KS_E_LIMIT, "bytes of memory";
                past about 8 MiB some meet the stack's limit of 2^20 slots first)
  except floods that flatten to many entries or copies (`output`):
                peak RSS <= E + 21 x B + 68 MiB

where B is the file's size and E the peak RSS of the same command on a pickle of
one None. 18 x B + 4 MiB = the machine's budget (KS__PK_MEM_PER_BYTE = 16 per
pickle byte + 1 MiB) + the input read into memory + slack; 21 x B + 68 MiB adds
what flattening may keep (max_output_bytes: 4 x the file + 64 MiB, each entry
and container counted with its record). A 20 MiB flood thus stays under 512 MiB
(E is about 9 MiB).
Standard library only; exits 77 (skipped) without /usr/bin/time.
"""
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile

LIMIT_PER_BYTE, LIMIT_BASE, ANY_PER_BYTE, ANY_BASE = 18, 4 << 20, 21, 68 << 20
TIME = "/usr/bin/time"
HANG_S = 60
BUDGET_TEXT = "bytes of memory"  # "pickle: needs more than N bytes of memory for its values, ..."

PROTO, STOP = b"\x80\x02", b"."
MARK, NONE, POP = b"(", b"N", b"0"
EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT, EMPTY_SET = b")", b"]", b"}", b"\x8f"
TUPLE, LIST, DICT, FROZENSET = b"t", b"l", b"d", b"\x91"
TUPLE1, TUPLE2, TUPLE3 = b"\x85", b"\x86", b"\x87"
APPEND, APPENDS, SETITEM, SETITEMS, ADDITEMS = b"a", b"e", b"s", b"u", b"\x90"
REDUCE, BUILD, NEWOBJ, NEWOBJ_EX, BINPERSID = b"R", b"b", b"\x81", b"\x92", b"Q"
MEMOIZE, DUP = b"\x94", b"2"


def glob(mod, name):
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def sglobal(mod, name):
    return sstr(mod) + sstr(name) + b"\x93"


def sstr(s):
    b = s.encode() if isinstance(s, str) else s
    return b"\x8c" + bytes([len(b)]) + b


def ustr(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def bbytes(b):
    return b"B" + struct.pack("<I", len(b)) + b


def put(i):
    return b"r" + struct.pack("<I", i)


def get(i):
    return b"j" + struct.pack("<I", i)


def pint(v):
    if 0 <= v < 256:
        return b"K" + bytes([v])
    return b"J" + struct.pack("<i", v)


def fill(head, unit, tail, size, unit_max=None):
    """head + unit * k + tail, about size bytes."""
    k = max(1, (size - len(head) - len(tail)) // len(unit))
    if unit_max:
        k = min(k, unit_max)
    return head + unit * k + tail


def batches(head, open_, item, close, tail, size, per=1 << 19): 
    """head + (open_ + item*per + close)* + tail: item floods in batches the stack limit (2^20) accepts."""
    one = open_ + item * per + close
    k = max(1, (size - len(head) - len(tail)) // len(one))
    return head + one * k + tail


def floods(size):
    """(name, pickle, kind). kind: 'limit' must be refused by the memory budget ('limit-pt': as a .pt; a
    .metadata refuses storages at once); 'machine' may pass or meet another limit of the machine, and
    flattens to little; 'output' flattens to many entries or copies (the output budget's share)."""
    P = PROTO
    yield "TUPLE1", P + NONE + fill(b"", TUPLE1, STOP, size), "limit"
    yield "TUPLE2", P + NONE + fill(b"", NONE + TUPLE2, STOP, size), "limit"
    yield "TUPLE3", P + NONE + fill(b"", NONE + NONE + TUPLE3, STOP, size), "limit"
    yield "EMPTY_TUPLE", P + fill(b"", EMPTY_TUPLE, STOP, size), "limit"
    yield "EMPTY_LIST", P + fill(b"", EMPTY_LIST, STOP, size), "limit"
    yield "EMPTY_DICT", P + fill(b"", EMPTY_DICT, STOP, size), "limit"
    yield "EMPTY_SET", P + fill(b"", EMPTY_SET, STOP, size), "limit"
    yield "MARK+TUPLE", P + fill(b"", MARK + TUPLE, STOP, size), "limit"
    yield "MARK+LIST", P + fill(b"", MARK + LIST, STOP, size), "limit"
    yield "MARK+DICT", P + fill(b"", MARK + DICT, STOP, size), "limit"
    yield "MARK+FROZENSET", P + fill(b"", MARK + FROZENSET, STOP, size), "limit"
    yield "MARK", P + fill(b"", MARK, STOP, size), "machine"  # the stack limit (2^20 marks) comes first
    yield "DUP", P + NONE + fill(b"", DUP, STOP, size), "machine"
    yield "NONE", P + fill(b"", NONE, STOP, size), "machine"
    yield "APPEND", P + fill(EMPTY_LIST, NONE + APPEND, STOP, size), "output"
    yield "APPENDS", P + batches(EMPTY_LIST, MARK, NONE, APPENDS, STOP, size), "output"
    yield "APPENDS of lists", P + batches(EMPTY_LIST, MARK, EMPTY_LIST, APPENDS, STOP, size), "limit"
    yield "SETITEM", P + fill(EMPTY_DICT, NONE + NONE + SETITEM, STOP, size), "output"
    yield "SETITEMS", P + batches(EMPTY_DICT, MARK, NONE + NONE, SETITEMS, STOP, size, 1 << 18), "output"
    yield "ADDITEMS", P + batches(EMPTY_SET, MARK, NONE, ADDITEMS, STOP, size), "output"
    yield "SHORT_BINUNICODE", P + fill(b"", sstr(""), STOP, size), "limit"
    yield "BINUNICODE", P + fill(b"", ustr(""), STOP, size), "machine"
    yield "BINUNICODE 64K", P + fill(b"", ustr("x" * (1 << 16)), STOP, size), "machine"
    yield "SHORT_BINBYTES", P + fill(b"", b"C\x00", STOP, size), "limit"
    yield "BINBYTES", P + fill(b"", bbytes(b""), STOP, size), "machine"
    yield "BINBYTES 64K", P + fill(b"", bbytes(bytes(1 << 16)), STOP, size), "machine"
    yield "BININT1", P + fill(b"", b"K\x07", STOP, size), "machine"
    yield "BININT2", P + b"".join(b"M" + struct.pack("<H", i % 65536) for i in range(size // 3)) + STOP, "machine"
    yield "BININT", P + b"".join(b"J" + struct.pack("<i", 65536 + i) for i in range(size // 5)) + STOP, "machine"
    yield "BINFLOAT", P + fill(b"", b"G" + bytes(8), STOP, size), "machine"
    yield "INT text", P + fill(b"", b"I7\n", STOP, size), "machine"
    yield "LONG1 empty", P + fill(b"", b"\x8a\x00", STOP, size), "machine"
    yield "LONG1 9 bytes", P + fill(b"", b"\x8a\x09" + b"\x01" * 9, STOP, size), "machine"
    # each converted to decimal once (quadratic CPU in its length, capped at 4096 bytes): fewer of them
    yield "LONG4 4096 bytes", P + fill(b"", b"\x8b" + struct.pack("<I", 4096) + b"\x01" * 4096, STOP, size // 8), \
        "machine"
    yield "MEMOIZE", P + NONE + fill(b"", MEMOIZE, STOP, size), "machine"
    yield "BINPUT high", P + NONE + put(size) + fill(b"", NONE + POP, STOP, size), "machine"
    yield "BINPUT each", P + NONE + b"".join(put(i) for i in range(size // 5)) + STOP, "machine"
    # BINGET of a big memoised list, appended again and again into one list
    big_list = EMPTY_LIST + MARK + NONE * 4096 + APPENDS + put(0)
    yield "BINGET big list", P + big_list + batches(EMPTY_LIST, MARK, get(0), APPENDS, STOP, size), "output"
    yield "APPENDS of BINGET None", P + NONE + put(0) + POP + batches(
        EMPTY_LIST, MARK, get(0), APPENDS, STOP, size), "output"
    # copies by constructors: set(), OrderedDict() of a memoised list, BUILD of a memoised dict
    seq = MARK + NONE * 60000 + LIST + put(0) + POP
    yield "REDUCE set()", P + seq + fill(b"", glob("builtins", "set") + MARK + get(0) + TUPLE + REDUCE + POP,
                                         NONE + STOP, size), "limit"
    pairs = MARK + (NONE + NONE + TUPLE2) * 30000 + LIST + put(0) + POP
    yield "REDUCE OrderedDict()", P + pairs + fill(
        b"", glob("collections", "OrderedDict") + MARK + get(0) + TUPLE + REDUCE + POP, NONE + STOP, size), "limit"
    state = EMPTY_DICT + MARK + b"".join(pint(i) + NONE for i in range(20000)) + SETITEMS + put(0) + POP
    yield "BUILD of a memoised dict", P + state + glob("a", "b") + EMPTY_TUPLE + REDUCE + fill(
        b"", get(0) + BUILD, STOP, size), "limit"
    yield "REDUCE unknown", P + glob("a", "b") + put(0) + fill(b"", get(0) + EMPTY_TUPLE + REDUCE, STOP, size), "limit"
    yield "NEWOBJ", P + glob("a", "b") + put(0) + fill(b"", get(0) + EMPTY_TUPLE + NEWOBJ, STOP, size), "limit"
    yield "NEWOBJ_EX", P + glob("a", "b") + put(0) + fill(
        b"", get(0) + EMPTY_TUPLE + EMPTY_DICT + NEWOBJ_EX, STOP, size), "limit"
    yield "BUILD", P + glob("a", "b") + EMPTY_TUPLE + REDUCE + fill(b"", EMPTY_DICT + BUILD, STOP, size), "machine"
    yield "REDUCE torch.device", P + glob("torch", "device") + put(0) + ustr("cpu") + put(1) + fill(
        b"", get(0) + get(1) + TUPLE1 + REDUCE, STOP, size), "machine"
    text = ustr("x" * (1 << 16)) + put(1) + ustr("latin1") + put(2)
    yield "REDUCE _codecs.encode", P + glob("_codecs", "encode") + put(0) + text + fill(
        b"", get(0) + get(1) + get(2) + TUPLE2 + REDUCE + POP, NONE + STOP, size), "limit"
    # numpy: BUILD of a byte-swapped array copies its memoised bytes every time (the views' budget)
    raw = bbytes(bytes(1 << 16))
    np = glob("numpy", "dtype") + ustr(">f8") + TUPLE1 + REDUCE + put(0) + POP
    np += MARK + pint(1) + pint(1 << 13) + TUPLE1 + get(0) + b"\x89" + raw + TUPLE + put(1) + POP
    np += glob("numpy.core.multiarray", "_reconstruct") + put(2) + POP
    yield "BUILD numpy array (swapped)", P + np + fill(
        b"", get(2) + EMPTY_TUPLE + REDUCE + get(1) + BUILD + POP, NONE + STOP, size), "output"
    yield "GLOBAL", P + fill(b"", glob("a", "b"), STOP, size), "machine"
    yield "STACK_GLOBAL", P + fill(b"", sglobal("a", "b"), STOP, size), "limit"
    # BINPERSID: the .pt has the storage; the .metadata refuses the reference (no archive)
    pid = MARK + ustr("storage") + glob("torch", "FloatStorage") + ustr("0") + ustr("cpu") + pint(4) + TUPLE + put(0)
    yield "BINPERSID", P + pid + POP + fill(b"", get(0) + BINPERSID, STOP, size), "machine"


def archive(path, pkl):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", b"\0" * 16)
        z.writestr("archive/version", "3\n")
    return path


def dcp_dir(path, pkl):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(pkl)
    return path


def run_measured(cmd, work):
    """(exit status or -signal, peak RSS in bytes, seconds, output) of cmd, measured by /usr/bin/time."""
    stats = os.path.join(work, "time.txt")
    t0 = time.monotonic()
    p = subprocess.Popen([TIME, "-f", "%x %M", "-o", stats] + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None, 0, HANG_S, "hang"
    took = time.monotonic() - t0
    with open(stats) as f:
        text = f.read()
    # GNU time writes "Command terminated by signal N" before "%x %M" when the child was killed
    words = text.split()
    rc = -int(text.split("signal ")[1].split()[0]) if "terminated by signal" in text else int(words[-2])
    return rc, int(words[-1]) * 1024, took, out.decode("utf-8", "replace")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = [a for a in sys.argv[1:] if a.startswith("--")]
    mib, only = 2.0, None
    for o in opts:
        if o.startswith("--mib="):
            mib = float(o.split("=", 1)[1])
        elif o.startswith("--only="):
            only = set(o.split("=", 1)[1].split(","))
    if "--list" in opts:
        for name, _, kind in floods(1 << 10):
            print(f"{name} ({kind})")
        return 0
    if not os.access(TIME, os.X_OK):
        print(f"SKIP: {TIME} is needed to measure a child's peak RSS")
        return 77
    ks, work = os.path.abspath(args[0]), os.path.abspath(args[1])
    check = "--no-assert" not in opts
    os.makedirs(work, exist_ok=True)
    size = int(mib * (1 << 20))
    out = os.path.join(work, "out.keepsake")
    base = {}
    for how in ("pt", "dcp"):
        src = archive(os.path.join(work, "empty.pt"), PROTO + NONE + STOP) if how == "pt" else \
            dcp_dir(os.path.join(work, "empty-dcp"), PROTO + NONE + STOP)
        base[how] = max(run_measured([ks, "convert", src, out], work)[1] for _ in range(3))
    print(f"one None: {base['pt'] / 2**20:.1f} MiB (.pt), {base['dcp'] / 2**20:.1f} MiB (.metadata) = E; bounds: "
          f"E + {LIMIT_PER_BYTE} x B + {LIMIT_BASE >> 20} MiB, E + {ANY_PER_BYTE} x B + {ANY_BASE >> 20} MiB "
          "(output floods)")
    failures, count, t_all = [], 0, time.monotonic()
    for name, pkl, kind in floods(size):
        if only and name not in only:
            continue
        for how in ("pt", "dcp"):
            count += 1
            if how == "pt":
                src = archive(os.path.join(work, "flood.pt"), pkl)
                nbytes = os.path.getsize(src)
            else:
                src = dcp_dir(os.path.join(work, "flood-dcp"), pkl)
                nbytes = len(pkl)
            rc, rss, took, text = run_measured([ks, "convert", src, out], work)
            limit = kind == "limit" or (kind == "limit-pt" and how == "pt")
            bound = base[how] + (ANY_PER_BYTE * nbytes + ANY_BASE if kind == "output" else
                                 LIMIT_PER_BYTE * nbytes + LIMIT_BASE)
            msg = text.strip().splitlines()[-1][:160] if text.strip() else ""
            print(f"  {rss / 2**20:7.1f} MiB {rss / nbytes:5.1f}/B {took:6.2f} s  {name:30s} {how:3s} rc={rc} {msg}")
            label = f"{name} ({how}, {nbytes} bytes)"
            if rc is None:
                failures.append(f"{label}: hang (> {HANG_S} s)")
            elif rc < 0:
                failures.append(f"{label}: killed by signal {-rc}")
            elif rc not in (0, 1):
                failures.append(f"{label}: exit {rc}: {msg}")
            elif rss > bound:
                failures.append(f"{label}: peak RSS {rss / 2**20:.1f} MiB > bound {bound / 2**20:.1f} MiB")
            elif limit and (rc != 1 or "KS_E_LIMIT" not in text or
                            not (BUDGET_TEXT in text or (size > 8 << 20 and "stack deeper than" in text))):
                failures.append(f"{label}: not refused by the memory budget: {msg}")
    for f in failures:
        print("FAIL", f)
    print(f"{count - len(failures)} of {count} flood runs within bounds ({time.monotonic() - t_all:.1f} s)")
    return 1 if failures and check else 0


if __name__ == "__main__":
    sys.exit(main())
