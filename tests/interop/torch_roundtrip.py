"""Round trip through keepsake with real torch.

torch.save files of random nested state dicts (several dtypes, 0-d, empty and
strided views, lists, tuples, int keys, empty containers) are converted to
keepsake and back with the keepsake CLI, then loaded with
torch.load(weights_only=True); every value must be identical, and under torch
2.x so must every container's kind and every key's type. Under torch 1.13 the
export uses --torch-compat 1.13 (floats travel as 0-d float64 tensors).
The shared fixtures (torch and Composer) go through the same round trip.

usage: torch_roundtrip.py KEEPSAKE_CLI [FIXTURES_DIR]
"""
import os
import random
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skipped: %s has no torch (Debian 13 ships none; Debian 12 has python3-torch 1.13)" % sys.executable)
    sys.exit(77)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def random_tensor(rng):
    dtype = rng.choice(DTYPES)
    shape = [rng.randint(0, 4) for _ in range(rng.randint(0, 3))]
    if dtype.is_floating_point:
        t = torch.randn(shape, dtype=torch.float64).to(dtype)
    elif dtype == torch.bool:
        t = torch.randint(0, 2, shape).bool()
    else:
        info = torch.iinfo(dtype)
        t = torch.randint(max(info.min, -2**40), min(info.max, 2**40), shape, dtype=torch.int64).to(dtype)
    kind = rng.random()
    if kind < 0.2 and t.dim() >= 2:
        t = t.transpose(0, 1)  # a transposed view
    elif kind < 0.3 and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]  # a view at an offset
    return t


MODERN = int(torch.__version__.split(".")[0]) >= 2


def random_leaf(rng):
    r = rng.random()
    if r < 0.6:
        return random_tensor(rng)
    if r < 0.7:
        return rng.randint(-2**40, 2**40)
    if r < 0.8:
        return rng.choice([True, False, None])
    if r < 0.9 and MODERN:
        return rng.choice([0.1, -2.5, 1e300, float("inf")])
    return "run-%d" % rng.randint(0, 99)


def random_tree(rng, depth=0):
    tree = {}
    for i in range(rng.randint(1, 5)):
        key = rng.choice(["w", "bias", "step", "state", "exp_avg", "layer.%d" % i, "x%d" % i, "a/b", "100%"])
        if MODERN and rng.random() < 0.2:
            key = rng.choice([i, -i, True, None])
        if depth < 3 and rng.random() < 0.3:
            tree[key] = random_tree(rng, depth + 1)
        elif depth < 3 and rng.random() < 0.2:
            items = [random_leaf(rng) for _ in range(rng.randint(0, 3))]
            if rng.random() < 0.3:
                items.append(random_tree(rng, depth + 1) if rng.random() < 0.5 else {})
            tree[key] = items if rng.random() < 0.5 else tuple(items)
        else:
            r = rng.random()
            if r < 0.6:
                tree[key] = random_tensor(rng)
            elif r < 0.7:
                tree[key] = rng.randint(-2**40, 2**40)
            elif r < 0.8:
                tree[key] = rng.choice([True, False, None])
            else:
                tree[key] = "run-%d" % rng.randint(0, 99)
    return tree


def flatten(obj, prefix=""):
    """'/'-joined paths, as keepsake names entries."""
    out = {}
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {prefix: obj}
    for k, v in items:
        out.update(flatten(v, "%s/%s" % (prefix, k) if prefix else str(k)))
    return out


def deep_same(a, b):
    """Same value, same container kinds, same key types (torch 2.x exports); dict order is free."""
    if isinstance(a, torch.Tensor) or not isinstance(a, (dict, list, tuple)):
        return same(a, b)
    kind = lambda v: dict if isinstance(v, dict) else type(v)  # an OrderedDict comes back as a dict
    if kind(a) != kind(b) or len(a) != len(b):
        return False
    if isinstance(a, dict):
        return (sorted(map(repr, a)) == sorted(map(repr, b))
                and all(k in b and type(next(x for x in b if x == k and type(x) == type(k))) == type(k)
                        and deep_same(a[k], b[k]) for k in a))
    return all(deep_same(x, y) for x, y in zip(a, b))


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def same(a, b):
    if isinstance(a, torch.Tensor):  # bitwise, so NaN and -0.0 must survive too
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(raw(a), raw(b)))
    if isinstance(a, float) and not MODERN:  # --torch-compat 1.13: floats travel as 0-d float64 tensors
        return isinstance(b, torch.Tensor) and b.dim() == 0 and b.dtype == torch.float64 and b.item() == a
    return type(a) == type(b) and a == b


def convert(cli, src, dst):
    compat = [] if MODERN or not dst.endswith(".pt") else ["--torch-compat", "1.13"]
    r = subprocess.run([cli, "convert", src, dst] + compat, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("keepsake convert %s %s failed: %s%s" % (src, dst, r.stdout, r.stderr))


def round_trip(cli, src, tmp, tag):
    ks, back = os.path.join(tmp, tag + ".keepsake"), os.path.join(tmp, tag + ".back.pt")
    convert(cli, src, ks)
    convert(cli, ks, back)
    return torch.load(back, weights_only=True)


def check(expected, loaded, tag):
    got = flatten(loaded)
    bad = [k for k, v in expected.items() if k not in got or not same(v, got[k])]
    extra = sorted(set(got) - set(expected))
    if bad or extra:
        raise SystemExit("%s: %d values differ (%s), unexpected keys %s" % (tag, len(bad), bad[:5], extra[:5]))


def main():
    cli = sys.argv[1]
    rng = random.Random(1234)
    torch.manual_seed(1234)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(25):
            tree = random_tree(rng)
            src = os.path.join(tmp, "r%d.pt" % i)
            torch.save(tree, src)
            expected = {k: v for k, v in flatten(tree).items()}
            back = round_trip(cli, src, tmp, "r%d" % i)
            if MODERN:
                if not deep_same(tree, back):
                    raise SystemExit("random tree %d: kinds or values differ:\n%r\n%r" % (i, tree, back))
            else:
                check(expected, back, "random tree %d" % i)
        if MODERN:  # a bare tensor, and containers of every kind at the root
            for i, obj in enumerate([torch.arange(5, dtype=torch.int16), [torch.ones(2), (1, None), {}],
                                     ({0: "a", -3: 2.5}, set(), [])]):
                src = os.path.join(tmp, "bare%d.pt" % i)
                torch.save(obj, src)
                back = round_trip(cli, src, tmp, "bare%d" % i)
                if not deep_same(obj, back):
                    raise SystemExit("bare value %d differs:\n%r\n%r" % (i, obj, back))
        if len(sys.argv) > 2:  # the legacy non-zip format is refused by name, not misread
            legacy = os.path.join(sys.argv[2], "torch213", "legacy.pt")
            r = subprocess.run([cli, "convert", legacy, os.path.join(tmp, "legacy.keepsake")],
                               capture_output=True, text=True)
            if r.returncode != 1 or "legacy torch.save format (_use_new_zipfile_serialization=False)" not in r.stderr:
                raise SystemExit("legacy.pt: expected a refusal naming the format, got %d: %s" % (r.returncode, r.stderr))
        if len(sys.argv) > 2:
            fixtures = os.path.join(sys.argv[2], "torch")
            for name in ["tensors", "mlp_state_dict", "adamw_state_dict"]:
                # trusted project fixtures; 1.13's weights_only loader refuses their Python floats
                original = torch.load(os.path.join(fixtures, name + ".pt"), weights_only=False)
                back = round_trip(cli, os.path.join(fixtures, name + ".pt"), tmp, name)
                check(flatten(original), back, name)
                if MODERN and not deep_same(original, back):
                    raise SystemExit("%s: container kinds or key types differ" % name)
    print("ok: 25 random trees, bare values and 3 fixtures round-trip through keepsake identically; "
          "the legacy format is refused by name")


if __name__ == "__main__":
    main()
