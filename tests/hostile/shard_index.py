#!/usr/bin/env python3
"""Sharded checkpoint directories must not trust their index.

  shard_index.py corpus       KEEPSAKE MAKE_SHARDED WORKDIR
  shard_index.py inspect-json KEEPSAKE MAKE_SHARDED WORKDIR
  shard_index.py globs        KEEPSAKE MAKE_SHARDED WORKDIR
  shard_index.py fuzz-corpus  MAKE_SHARDED OUTDIR

corpus: MAKE_SHARDED writes a valid 3-rank directory; this generator derives from
it at least 50 variants whose index `sharded` section (or the files it names) is
malformed: overlaps, gaps, missing and extra tensors, missing rank files, shapes
whose volume overflows, chunks past the files' sizes, huge chunk counts, negative,
fractional and non-numeric numbers, wrong dtypes, duplicated chunks, moved chunks.
For each, `keepsake verify DIR` must exit 1 naming the file and the key; on
several, `keepsake diff` (exit 2) and `keepsake reshard` (exit 1) must fail too,
naming the key. No run may die from a signal, and each child's peak RSS
(os.wait4) must stay within 64 MiB above the size of the directory's files.

inspect-json: `keepsake inspect --json DIR` prints the index and each rank file
as `inspect --json FILE` shows it, metrics with class, update count and value.

globs: MAKE_SHARDED --long-names 1 1000 --globs 4092 writes the hostile case of per-rank globs
(a 170 KB index, 165 KB rank files: 4,096 globs, a name with 500 '/' boundaries); verify, diff
and reshard must each take at most 5 s of CPU (a matcher that runs every glob over every
'/'-prefix of every name took 17 s to reshard it).

fuzz-corpus: writes the valid index and each variant's index (those under 64 KiB,
the fuzzers' input size; the same index once) into OUTDIR, the seed corpus of
tests/fuzz/fuzz_shard_index.c (tests/fuzz/corpus/shard_index/).

Standard library only.
"""
import copy
import json
import os
import shutil
import subprocess
import sys

INDEX = "model.safetensors.index.json"
W, V, B = "state/model/w", "state/model/v", "state/model/b"
RANK = ["rank-%05d-of-00003.keepsake" % r for r in range(3)]
SLACK = 64 << 20  # bytes of peak RSS allowed above the size of the files


def run_measured(argv, cpu=None):
    """Runs argv and reaps it with os.wait4, so ru_maxrss is that child's own peak (bytes); with a
    list `cpu`, the child's CPU seconds (user + system) are appended to it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.dup2(w, 2)
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status, ru = os.wait4(pid, 0)
    if cpu is not None:
        cpu.append(ru.ru_utime + ru.ru_stime)
    if os.WIFSIGNALED(status):
        raise SystemExit("FAIL: %s died from signal %d" % (" ".join(argv), os.WTERMSIG(status)))
    return os.WEXITSTATUS(status), b"".join(chunks).decode("utf-8", "replace"), ru.ru_maxrss * 1024


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


# ---- the variants: (name, mutate(index dict, directory) -> expected file, expected key) ----

def sharded(ix):
    return ix["keepsake"]["sharded"]


def chunks(ix, name):
    return sharded(ix)[name]["chunks"]


def set_chunk(name, j, **fields):
    def m(ix, d):
        chunks(ix, name)[j].update(fields)
        return INDEX, name
    return m


def set_tensor(name, **fields):
    def m(ix, d):
        sharded(ix)[name].update(fields)
        return INDEX, name
    return m


def tile(name, dtype, gshape, parts, want_file=INDEX, key=None):
    """Replaces a tensor's entry: parts = [(rank, offsets, shape)]."""
    def m(ix, d):
        sharded(ix)[name] = {"dtype": dtype, "global_shape": gshape,
                             "chunks": [{"rank": r, "offsets": o, "shape": s} for r, o, s in parts]}
        return want_file, key or name
    return m


def drop_tensor(name, holder):
    def m(ix, d):
        del sharded(ix)[name]
        return holder, name
    return m


def dup_chunk(name, j, n=1):
    def m(ix, d):
        chunks(ix, name).extend(copy.deepcopy(chunks(ix, name)[j]) for _ in range(n))
        return INDEX, name
    return m


def drop_chunk(name, j):
    def m(ix, d):
        del chunks(ix, name)[j]
        return INDEX, name
    return m


def swap_ranks(name, a, b):
    def m(ix, d):
        c = chunks(ix, name)
        c[a]["rank"], c[b]["rank"] = c[b]["rank"], c[a]["rank"]
        return RANK[min(c[a]["rank"], c[b]["rank"])], name
    return m


def whole_section(value):
    def m(ix, d):
        ix["keepsake"]["sharded"] = value
        return INDEX, "keepsake.sharded"
    return m


def remove_file(r):
    def m(ix, d):
        os.unlink(os.path.join(d, RANK[r]))
        return RANK[r], "keepsake.files"
    return m


def truncate_file(r):
    def m(ix, d):
        p = os.path.join(d, RANK[r])
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) // 2)
        return RANK[r], "keepsake.files"
    return m


def file_size(r, size):
    def m(ix, d):
        ix["keepsake"]["files"][r]["size"] = size
        return INDEX, W  # the chunks of that file no longer fit in its recorded size
    return m


BIG = 2 ** 62
A = 2 ** 28 // 3
I64 = 2 ** 63 - 1
W_PARTS = [(0, [0, 0], [3, 2]), (1, [3, 0], [3, 2]), (2, [6, 0], [1, 2])]
V_PARTS = [(r, [0, 2 * r], [4, 2]) for r in range(3)]

VARIANTS = [
    # overlaps and gaps (chunk volumes may still add up to the global volume)
    ("overlap-dim0", set_chunk(W, 1, offsets=[2, 0])),
    ("overlap-dim1", set_chunk(V, 1, offsets=[0, 1])),
    ("overlap-other-rank", set_chunk(W, 2, offsets=[0, 0])),
    ("overlap-grid", tile(V, "F32", [4, 6], [(0, [0, 0], [2, 6]), (1, [1, 0], [2, 6]), (2, [3, 0], [1, 0])])),
    ("overlap-same-volume", tile(W, "F32", [7, 2], [(0, [0, 0], [4, 2]), (1, [3, 0], [3, 2]), (2, [6, 0], [0, 2])])),
    ("gap-short-chunk", set_chunk(W, 2, shape=[0, 2])),
    ("gap-missing-chunk", drop_chunk(W, 2)),
    ("gap-no-chunks", set_tensor(W, chunks=[])),
    ("gap-global-grown", set_tensor(W, global_shape=[8, 2])),
    ("gap-dim1", set_chunk(V, 2, shape=[4, 1])),
    # duplicated chunks
    ("duplicate-chunk", dup_chunk(W, 0)),
    ("duplicate-chunk-all-one-rank", tile(W, "F32", [7, 2], [(0, [0, 0], [3, 2]), (0, [3, 0], [3, 2]), (0, [6, 0], [1, 2])])),
    ("huge-chunk-count", dup_chunk(W, 0, 20000)),
    ("huge-chunk-count-2", dup_chunk(V, 1, 60000)),
    # missing and extra tensors, missing and changed rank files
    ("tensor-not-in-file", tile("state/model/ghost", "F32", [2], [(0, [0], [2])], RANK[0])),
    ("tensor-dropped-from-index", drop_tensor(V, RANK[0])),
    ("replicated-listed-as-sharded", tile(B, "F32", [4], [(0, [0], [4])], RANK[0])),
    ("rank-file-missing", remove_file(1)),
    ("rank-file-truncated", truncate_file(2)),
    ("chunks-moved-between-ranks", swap_ranks(W, 0, 1)),
    ("chunks-moved-dim1", swap_ranks(V, 1, 2)),
    # shapes whose element or byte counts overflow, and chunks past the files
    ("overflow-2^62x2^62", tile(W, "F32", [BIG, BIG], [(0, [0, 0], [BIG, BIG])])),
    ("overflow-i64max", tile(W, "F32", [I64, I64], [(0, [0, 0], [I64, I64])])),
    ("overflow-bytes", tile(W, "F32", [2 ** 31, 2 ** 31], [(0, [0, 0], [2 ** 31, 2 ** 31])])),
    ("overflow-8-dims", tile(W, "U8", [256] * 8, [(0, [0] * 8, [256] * 8)])),
    ("overflow-split", tile(W, "F32", [BIG, 4], [(0, [0, 0], [BIG // 2, 4]), (1, [BIG // 2, 0], [BIG // 2, 4])])),
    ("past-file-size", tile(W, "F32", [7000000000, 2], [(0, [0, 0], [6999999996, 2]), (1, [6999999996, 0], [3, 2]),
                                                        (2, [6999999999, 0], [1, 2])])),
    ("past-file-2gb", tile(W, "F64", [2 ** 28, 1], [(0, [0, 0], [A, 1]), (1, [A, 0], [A, 1]),
                                                    (2, [2 * A, 0], [2 ** 28 - 2 * A, 1])])),
    ("past-file-size-small", file_size(0, 40)),
    ("past-file-dim1", tile(V, "F32", [4, 3000000], [(r, [0, r * 1000000], [4, 1000000]) for r in range(3)])),
    ("zero-dim-huge", tile(W, "F32", [0, BIG, BIG], [(0, [0, 0, 0], [0, BIG, BIG])], RANK[0])),
    # numbers that are not non-negative integers
    ("negative-offset", set_chunk(W, 0, offsets=[-1, 0])),
    ("negative-shape", set_chunk(W, 0, shape=[-3, 2])),
    ("negative-global", set_tensor(W, global_shape=[-7, 2])),
    ("negative-rank", set_chunk(W, 0, rank=-1)),
    ("fractional-offset", set_chunk(W, 1, offsets=[3.5, 0])),
    ("fractional-shape", set_chunk(W, 1, shape=[3.0, 2])),
    ("fractional-global", set_tensor(W, global_shape=[7.0, 2])),
    ("string-shape", set_chunk(W, 1, shape=["3", 2])),
    ("string-rank", set_chunk(W, 1, rank="1")),
    ("bool-rank", set_chunk(W, 1, rank=True)),
    ("null-offsets", set_chunk(W, 1, offsets=None)),
    ("huge-offset", set_chunk(W, 2, offsets=[I64, 0])),
    ("int-beyond-i64", set_chunk(W, 2, offsets=[2 ** 70, 0])),
    ("exponent-number", set_chunk(W, 2, offsets=[6e0, 0])),
    ("rank-out-of-range", set_chunk(W, 2, rank=3)),
    ("rank-huge", set_chunk(W, 2, rank=2 ** 40)),
    # dims that do not match
    ("offsets-short", set_chunk(W, 0, offsets=[0])),
    ("shape-long", set_chunk(W, 0, shape=[3, 2, 1])),
    ("nine-dims", set_tensor(W, global_shape=[1] * 9)),
    ("global-rank-changed", tile(W, "F32", [14], [(0, [0], [6]), (1, [6], [6]), (2, [12], [2])], RANK[0])),
    ("scalar-global", tile(W, "F32", [], [(0, [], [])], RANK[0])),
    ("scalar-global-3-chunks", tile(W, "F32", [], [(0, [], []), (1, [], []), (2, [], [])])),
    ("shape-outside", set_chunk(W, 2, shape=[2, 2])),
    ("offset-outside", set_chunk(W, 2, offsets=[8, 0])),
    ("file-shape-differs", tile(W, "F32", [8, 2], [(0, [0, 0], [3, 2]), (1, [3, 0], [3, 2]), (2, [6, 0], [2, 2])], RANK[2])),
    ("empty-global", tile(W, "F32", [0, 2], [(0, [0, 0], [0, 2]), (1, [0, 0], [0, 2]), (2, [0, 0], [0, 2])], RANK[0])),
    # dtypes
    ("dtype-wrong-size", lambda ix, d: (sharded(ix)[W].update(dtype="F64"), (RANK[0], W))[1]),
    ("dtype-same-size", lambda ix, d: (sharded(ix)[V].update(dtype="I32"), (RANK[0], V))[1]),
    ("dtype-unknown", set_tensor(W, dtype="F33")),
    ("dtype-missing", lambda ix, d: (sharded(ix)[W].pop("dtype"), (INDEX, W))[1]),
    ("dtype-number", set_tensor(W, dtype=4)),
    # the section's structure
    ("section-array", whole_section([])),
    ("section-null", whole_section(None)),
    ("section-string", whole_section("w")),
    ("tensor-not-object", set_tensor(W, chunks=5)),
    ("chunks-object", set_tensor(W, chunks={"rank": 0})),
    ("chunk-empty-object", lambda ix, d: (chunks(ix, W).__setitem__(0, {}), (INDEX, W))[1]),
    ("chunk-number", lambda ix, d: (chunks(ix, W).__setitem__(0, 7), (INDEX, W))[1]),
    ("tensor-name-empty", tile("", "F32", [2], [(0, [0], [2])], INDEX, "keepsake.sharded")),
    ("tensor-name-long", tile("x" * 2000, "F32", [2], [(0, [0], [2])], INDEX, "keepsake.sharded")),
    # DCP values: one whole 1-d U8 tensor (an entry with no chunk tiles an empty global shape)
    ("object-no-chunks", tile("keepsake.dcp.object/x", "U8", [0], [])),
    ("object-two-chunks", tile("keepsake.dcp.object/x", "U8", [4], [(0, [0], [2]), (1, [2], [2])])),
]


def make_variant(valid, work, name, mutate):
    d = os.path.join(work, name)
    shutil.copytree(valid, d)
    with open(os.path.join(d, INDEX)) as f:
        ix = json.load(f)
    want_file, want_key = mutate(ix, d)
    with open(os.path.join(d, INDEX), "w") as f:
        json.dump(ix, f, indent=1, sort_keys=True)
    return d, want_file, want_key


def check_refused(cmd, argv, d, want_status, want_file, want_key, failures):
    status, out, rss = run_measured(argv)
    limit = dir_bytes(d) + SLACK
    name = os.path.basename(d)
    if status != want_status:
        failures.append("%s %s: exit %d, want %d\n%s" % (cmd, name, status, want_status, out[-600:]))
    elif want_file and want_file not in out:
        failures.append("%s %s: the output does not name the file %s\n%s" % (cmd, name, want_file, out[-600:]))
    elif want_key and want_key[:200] not in out:
        failures.append("%s %s: the output does not name the key %s\n%s" % (cmd, name, want_key[:60], out[-600:]))
    if rss > limit:
        failures.append("%s %s: peak RSS %d bytes, more than %d (files + 64 MiB)" % (cmd, name, rss, limit))
    return rss


# Variants diff and reshard must also refuse (exit 2 and 1), naming the key.
LOADED = ["overlap-dim0", "overlap-grid", "gap-dim1", "huge-chunk-count", "overflow-2^62x2^62", "past-file-size",
          "past-file-2gb", "tensor-not-in-file", "tensor-dropped-from-index", "chunks-moved-between-ranks",
          "dtype-same-size", "duplicate-chunk", "rank-file-missing", "empty-global", "zero-dim-huge",
          "global-rank-changed", "replicated-listed-as-sharded"]


def corpus(cli, make, work):
    valid = os.path.join(work, "valid")
    subprocess.check_call([make, valid])
    status, out, _ = run_measured([cli, "verify", valid])
    if status != 0 or "OK (sharded checkpoint" not in out:
        raise SystemExit("FAIL: the valid directory does not verify:\n" + out)
    if len(VARIANTS) < 50:
        raise SystemExit("FAIL: only %d variants" % len(VARIANTS))
    failures, peak, made = [], 0, {}
    for name, mutate in VARIANTS:
        d, want_file, want_key = make_variant(valid, work, name, mutate)
        made[name] = (d, want_file, want_key)
        peak = max(peak, check_refused("verify", [cli, "verify", d], d, 1, want_file, want_key, failures))
    for name in LOADED:
        d, want_file, want_key = made[name]
        key = None if want_key == "keepsake.files" else want_key
        peak = max(peak, check_refused("diff", [cli, "diff", valid, d], d, 2, None, key, failures))
        out_dir = os.path.join(work, "resharded-" + name)
        peak = max(peak, check_refused("reshard", [cli, "reshard", d, "--world-size", "2", out_dir], d, 1, None, key,
                                       failures))
        if os.path.exists(os.path.join(out_dir, INDEX)):
            failures.append("reshard %s: wrote an index" % name)
    for f in failures:
        print("FAIL:", f)
    print("%d variants refused by verify, %d by diff and reshard; peak RSS %.1f MiB; %d failures"
          % (len(VARIANTS), len(LOADED), peak / 2 ** 20, len(failures)))
    return 1 if failures else 0


def inspect_json(cli, make, work):
    d = os.path.join(work, "ckpt")
    subprocess.check_call([make, d])
    status, out, _ = run_measured([cli, "inspect", "--json", d])
    if status != 0:
        raise SystemExit("FAIL: inspect --json DIR exited %d:\n%s" % (status, out))
    doc = json.loads(out)
    assert doc["format"] == "keepsake-sharded" and doc["world_size"] == 3, doc.keys()
    assert doc["timestamp"] == {"epoch": 2, "batch": 5}, doc["timestamp"]
    w = [s for s in doc["sharded"] if s["name"] == W][0]
    assert w["dtype"] == "F32" and w["global_shape"] == [7, 2], w
    assert [c["shape"] for c in w["chunks"]] == [[3, 2], [3, 2], [1, 2]], w["chunks"]
    assert len(doc["files"]) == 3
    for r, f in enumerate(doc["files"]):
        assert f["rank"] == r and f["name"] == RANK[r], f.get("name")
        assert f["index_size"] == os.path.getsize(os.path.join(d, RANK[r]))
        # each rank file as `inspect --json FILE` reports it
        status, single, _ = run_measured([cli, "inspect", "--json", os.path.join(d, RANK[r])])
        one = json.loads(single)
        for k in ("file", "format", "tensors", "scalars", "metadata", "metrics"):
            assert f[k] == one[k], (r, k)
        m = f["metrics"]["state/train_metrics/S"]
        assert m["class"] == "SumMetric", m
        assert m["update_count"] == r + 1, m
        assert float(m["computed"]) == r + 1, m
    # a malformed index is an error on stderr, not half a JSON document
    with open(os.path.join(d, INDEX)) as f:
        ix = json.load(f)
    chunks(ix, W)[1]["offsets"] = [2, 0]
    with open(os.path.join(d, INDEX), "w") as f:
        json.dump(ix, f)
    status, out, _ = run_measured([cli, "inspect", "--json", d])
    assert status == 1 and W in out and INDEX in out, (status, out)
    print("inspect --json DIR: 3 rank files with their metrics (class, update count, computed value)")
    return 0


GLOBS_CPU = 5.0  # seconds of CPU per command (0.1 s in a release build)


def globs(cli, make, work):
    d, out = os.path.join(work, "globs"), os.path.join(work, "globs-2")
    subprocess.check_call([make, d, "--long-names", "1", "1000", "--globs", "4092"])
    with open(os.path.join(d, INDEX)) as f:
        assert len(json.load(f)["keepsake"]["per_rank"]) == 4096
    failures = []
    for argv, want in (([cli, "verify", d], 0), ([cli, "diff", d, d], 0),
                       ([cli, "reshard", d, "--world-size", "2", out], 0), ([cli, "diff", d, out], 0)):
        cpu = []
        status, text, _ = run_measured(argv, cpu)
        print("%-7s %.2f s of CPU, exit %d" % (argv[1], cpu[0], status))
        if status != want:
            failures.append("%s: exit %d, want %d\n%s" % (" ".join(argv[1:2]), status, want, text[-600:]))
        if cpu[0] > GLOBS_CPU:
            failures.append("%s: %.2f s of CPU, more than %.0f s" % (argv[1], cpu[0], GLOBS_CPU))
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def fuzz_corpus(make, out):
    work = out + ".work"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    valid = os.path.join(work, "valid")
    subprocess.check_call([make, valid])
    os.makedirs(out, exist_ok=True)
    seen, written = set(), 0
    with open(os.path.join(valid, INDEX), "rb") as f:
        texts = [("valid", f.read())]
    ix = json.loads(texts[0][1])
    texts.append(("valid-compact", json.dumps(ix, separators=(",", ":")).encode()))
    v1 = copy.deepcopy(ix)  # a version 1 index records each whole file's hash as "xxh3"
    v1["keepsake"]["version"] = 1
    for f in v1["keepsake"]["files"]:
        f["xxh3"] = f.pop("header_xxh3")
    texts.append(("version-1", json.dumps(v1, indent=1, sort_keys=True).encode()))
    for name, mutate in VARIANTS:
        d, _, _ = make_variant(valid, work, name, mutate)
        with open(os.path.join(d, INDEX), "rb") as f:
            texts.append((name, f.read()))
    for name, text in texts:
        if len(text) > 65536 or text in seen:
            continue
        seen.add(text)
        with open(os.path.join(out, name.replace("^", "p") + ".json"), "wb") as f:
            f.write(text)
        written += 1
    shutil.rmtree(work)
    print("%d indexes written to %s" % (written, out))
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "fuzz-corpus":
        return fuzz_corpus(sys.argv[2], sys.argv[3])
    if len(sys.argv) != 5 or sys.argv[1] not in ("corpus", "inspect-json", "globs"):
        raise SystemExit(__doc__)
    mode, cli, make, work = sys.argv[1:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return {"corpus": corpus, "inspect-json": inspect_json, "globs": globs}[mode](cli, make, work)


if __name__ == "__main__":
    sys.exit(main())
