"""Over the malformed corpus, keepsake accepts exactly what the reference safetensors reader accepts.

The corpus comes from safetensors_corpus.py; its committed copy in
tests/fuzz/corpus/safetensors/reference/ must match the generator byte for byte. For every
case the reference decides (safe_open with the numpy and the torch framework, and
safetensors.deserialize over the bytes, which must agree), and keepsake answers three times:
the library (ks_load through safetensors_helper), `keepsake inspect --json` and `keepsake
verify`, which must agree too. When both accept, they must read the same names, dtypes, shapes,
bytes and metadata.

keepsake is never laxer than the reference. Where it is stricter on purpose, the case is in
EXPECTED_DIFFERENCES below with the status keepsake gives, and docs/FORMAT.md section 5.1
documents it: an undocumented difference, a documented one that went away, or a difference
missing from the document fails the test.

usage: safetensors_malformed.py HELPER CLI SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

from safetensors_common import TORCH_DTYPES, Checks, args, helper_read, safetensors, torch_entry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_corpus  # noqa: E402

# Case -> the status keepsake refuses it with. The reference accepts each of these.
EXPECTED_DIFFERENCES = {
    "diff_duplicate_tensor": "KS_E_EXISTS",
    "diff_duplicate_meta_key": "KS_E_EXISTS",
    "diff_nul_in_name": "KS_E_FORMAT",
    "diff_nul_in_meta_value": "KS_E_FORMAT",
    "diff_empty_name": "KS_E_FORMAT",
    "diff_name_1025": "KS_E_LIMIT",
    "diff_rank_9": "KS_E_LIMIT",
    "diff_dim_above_int64": "KS_E_LIMIT",
    "diff_dtype_f8_e8m0": "KS_E_DTYPE",
    "diff_dtype_f4": "KS_E_DTYPE",
    "diff_keepsake_other_format": "KS_E_FORMAT",
    "diff_keepsake_future_version": "KS_E_VERSION",
    "diff_keepsake_bad_version": "KS_E_FORMAT",
    "diff_keepsake_bad_scalars": "KS_E_FORMAT",
}


def reference_accepts(path):
    """True/False per the reference, or a string when its entry points disagree."""
    verdicts = []
    for framework in ("numpy", "pt"):
        try:
            with safetensors.safe_open(path, framework=framework) as f:
                f.keys()
            verdicts.append(True)
        except Exception:  # the reference raises SafetensorError, and OSError for some short files
            verdicts.append(False)
    try:
        safetensors.deserialize(open(path, "rb").read())
        verdicts.append(True)
    except Exception:
        verdicts.append(False)
    return verdicts[0] if len(set(verdicts)) == 1 else f"reference entry points disagree: {verdicts}"


def reference_contents(path):
    with safetensors.safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: torch_entry(f.get_tensor(k)) for k in f.keys() if f.get_slice(k).get_dtype() in TORCH_DTYPES}
    return tensors, meta


def documented_cases(src):
    text = open(os.path.join(src, "docs", "FORMAT.md"), encoding="utf-8").read()
    m = re.search(r"^### 5\.1 .*?(?=^## |\Z)", text, re.S | re.M)
    return set(re.findall(r"`(diff_[a-z0-9_]+)`", m.group(0))) if m else set()


def check_committed(c, src, cases):
    d = os.path.join(src, "tests", "fuzz", "corpus", "safetensors", "reference")
    on_disk = set(os.listdir(d)) if os.path.isdir(d) else set()
    c.check(on_disk == set(cases), f"committed corpus {d} lists the generated cases "
            f"(missing {sorted(set(cases) - on_disk)[:5]}, extra {sorted(on_disk - set(cases))[:5]}); "
            "regenerate it with tests/interop/safetensors_corpus.py")
    stale = [n for n in cases if n in on_disk and open(os.path.join(d, n), "rb").read() != cases[n]]
    c.check(not stale, f"committed corpus cases differ from the generator: {stale[:5]}")


def keepsake_cli(cli, path):
    inspect = subprocess.run([cli, "inspect", path, "--json"], capture_output=True).returncode
    verify = subprocess.run([cli, "verify", path], capture_output=True).returncode
    return inspect, verify


def main():
    helper, cli, src, _ = args()
    c = Checks()
    cases = safetensors_corpus.build()
    c.check(len(cases) >= 60, f"at least 60 cases ({len(cases)})")
    check_committed(c, src, cases)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, blob in cases.items():
            paths[name] = os.path.join(tmp, name)
            with open(paths[name], "wb") as f:
                f.write(blob)
        lib = helper_read(helper, list(paths.values()))
        found, both_accept, both_reject = {}, 0, 0
        for name, path in paths.items():
            ref = reference_accepts(path)
            if not c.check(isinstance(ref, bool), f"{name}: {ref}"):
                continue
            r = lib[path]
            ks = r["status"] == "KS_OK"
            inspect, verify = keepsake_cli(cli, path)
            c.check((inspect == 0) == ks and (verify == 0) == ks,
                    f"{name}: library {r['status']} but inspect exit {inspect}, verify exit {verify}")
            if ref and ks:
                both_accept += 1
                tensors, meta = reference_contents(path)
                mine = {k: v for k, v in r["tensors"].items() if k in tensors}
                c.same(mine, tensors, f"{name}: both accept; same tensors")
                c.check(r["metadata"] == meta, f"{name}: both accept; metadata {r['metadata']} vs {meta}")
            elif not ref and not ks:
                both_reject += 1
            elif ks:
                c.check(False, f"{name}: keepsake accepts what the reference refuses")
            else:
                found[name] = r["status"]
                print(f"diff {name}: the reference accepts, keepsake refuses: {r['status']} {r['message']}")
        for name in sorted(found.keys() - EXPECTED_DIFFERENCES.keys()):
            c.check(False, f"{name}: undocumented difference ({found[name]}: keepsake refuses, the reference accepts)")
        for name in sorted(EXPECTED_DIFFERENCES.keys() - found.keys()):
            c.check(False, f"{name}: documented difference no longer differs (or the case is gone)")
        for name in sorted(found.keys() & EXPECTED_DIFFERENCES.keys()):
            c.check(found[name] == EXPECTED_DIFFERENCES[name], f"{name}: {found[name]}, documented "
                    f"{EXPECTED_DIFFERENCES[name]}")
        documented = documented_cases(src)
        c.check(documented == set(EXPECTED_DIFFERENCES), "docs/FORMAT.md section 5.1 lists exactly the expected "
                f"differences (missing {sorted(set(EXPECTED_DIFFERENCES) - documented)}, "
                f"extra {sorted(documented - set(EXPECTED_DIFFERENCES))})")
    print(f"{len(cases)} cases: {both_accept} accepted by both, {both_reject} refused by both, "
          f"{len(found)} refused only by keepsake (documented: {', '.join(sorted(found))})")
    c.finish("malformed corpus")


if __name__ == "__main__":
    main()
