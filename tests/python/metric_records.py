"""Generated hostile `keepsake.metrics` records for keepsake.compute_metrics.

  metric_records.py CHECKPOINT SEED COUNT

Rewrites the record of CHECKPOINT (a keepsake file with train and eval metrics) COUNT times:
classes from the catalogue and not, arguments of every type and range, records for paths that
name new eval labels, empty labels, nested or over-long names; the tensor data is kept as is.
Each mutant goes through compute_metrics in this process: KeepsakeError is expected, anything
else raises out of here, and a crash (the double free of a failing eval collection) kills the
process. Prints {outcome: count} as JSON. Used by test_robust.py, in a child process.
"""
import json
import pathlib
import random
import struct
import sys

import keepsake

VALUES = [None, True, False, 0, 1, -1, 2, 3, 2**31, 2**63 - 1, -2**63, 1e308, -0.5, 0.5, "macro", "micro", "none",
          "weighted", "global", "samplewise", "", [], {}, [1, 2], {"a": 1}, "x" * 5000, 1 << 20, 65536]
ARGS = ["num_classes", "num_labels", "average", "top_k", "ignore_index", "multidim_average", "threshold", "normalize",
        "thresholds", "max_fpr", "nan_strategy", "vocab_size", "squared", "num_outputs", "adjusted", "multioutput",
        "task", "foo"]


def main():
    src, seed, count = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    raw = src.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = json.loads(header["__metadata__"]["keepsake.metrics"])
    classes = keepsake.metric_catalogue() + ["", "X", "MeanMetric\u00e9", "a" * 300]
    paths = list(base) + ["state/eval_metrics/x/Y", "state/eval_metrics//Z", "state/eval_metrics/a/b/c",
                          "state/train_metrics/", "state/eval_metrics/" + "l" * 300 + "/M",
                          "state/train_metrics/" + "m" * 300, "zzz"]
    rng = random.Random(seed)
    out = src.with_name("mutant.keepsake")
    counts = {}
    for _ in range(count):
        rec = json.loads(json.dumps(base))
        for _ in range(rng.randint(1, 4)):
            r = rec.setdefault(rng.choice(paths), {})
            if not isinstance(r, dict):
                continue
            k = rng.random()
            if k < 0.3:
                r["class"] = rng.choice(classes + [rng.choice(VALUES)])
            elif k < 0.7:
                a = r.setdefault("args", {})
                if isinstance(a, dict):
                    a[rng.choice(ARGS)] = rng.choice(VALUES)
            elif k < 0.8:
                r["args"] = rng.choice(VALUES)
            elif k < 0.9:
                r["update_count"] = rng.choice(VALUES)
            else:
                r["schema_version"] = rng.choice(VALUES)
        meta = dict(header["__metadata__"], **{"keepsake.metrics": json.dumps(rec)})
        nh = json.dumps(dict(header, __metadata__=meta)).encode()
        nh += b" " * (-len(nh) % 8)
        out.write_bytes(struct.pack("<Q", len(nh)) + nh + raw[8 + n:])
        try:
            keepsake.compute_metrics(out)
            what = "ok"
        except keepsake.KeepsakeError as e:
            what = type(e).__name__
        counts[what] = counts.get(what, 0) + 1
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
