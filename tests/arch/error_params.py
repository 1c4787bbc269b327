#!/usr/bin/env python3
"""Every public function returning ks_status takes a trailing `ks_error *err`.

Lists the declarations in include/keepsake/*.h (binding.h included) that return ks_status without
a ks_error parameter and fails when one is not in ALLOWED below. An entry of
ALLOWED is a function that cannot fail for a reason worth a message: its only
failures are a NULL argument or "not found", which its status already says in
full. Usage: error_params.py SOURCE_DIR [--list]
"""
import pathlib
import re
import sys

# name -> why a ks_status alone says everything (keep each reason honest).
LOOKUP = "a look-up: KS_E_NOTFOUND (no such index or name) is the whole story"
ALLOWED = {
    "ks_dtype_parse": "parses a name the caller holds: KS_E_DTYPE means unknown, nothing more to say",
    "ks_reduce_parse": "parses a name the caller holds: KS_E_NOTFOUND means unknown, nothing more to say",
    "ks_dtype_convert": "pure conversion of the caller's buffers: KS_E_DTYPE (pair not convertible) only",
    "ks_tensor_init": "fills a descriptor: KS_E_INVALID (rank) or KS_E_LIMIT (size overflow) for the caller's own arguments",
    "ks_shape_size": "arithmetic on the caller's shape: KS_E_INVALID or KS_E_LIMIT (overflow) only",
    "ks_shard_file_name": "formats a name from two integers: KS_E_INVALID (out of range) only",
    "ks_meta_at": LOOKUP,
    "ks_reader_tensor_at": LOOKUP,
    "ks_reader_tensor_info": LOOKUP,
    "ks_reader_tensor_desc": LOOKUP,
    "ks_metric_state_info": LOOKUP,
    "ks_metric_attr_at": LOOKUP,
    "ks_shard_map_at": LOOKUP,
    "ks_shard_map_get": LOOKUP,
    "ks_shard_index_sharded_at": LOOKUP,
    "ks_shard_index_chunk": LOOKUP,
    "ks_load_report_at": LOOKUP,
    "ks_statedict_at": LOOKUP,
    "ks_statedict_get": LOOKUP,
    "ks_statedict_remove": LOOKUP + " (it frees, never allocates)",
}

DECL = re.compile(r"(?:^|[;}/])\s*(?:KS_API\s+)?(?:KS_NODISCARD\s+)?ks_status\s+(ks_[a-z0-9_]+)\s*\(((?:[^()]|\([^()]*\))*)\)", re.S)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def declarations(include_dir):
    for h in sorted(include_dir.glob("keepsake/*.h")):
        # The opening of a declaration block ends what comes before the first declaration.
        text = re.sub(r"\bKS_BEGIN_(?:BINDING_)?DECLS\b", ";", strip_comments(h.read_text()))
        for m in DECL.finditer(text):
            yield h.name, m.group(1), " ".join(m.group(2).split())


def main():
    root = pathlib.Path(sys.argv[1])
    listing = "--list" in sys.argv
    total = missing = 0
    bad = []
    seen = set()
    for header, name, params in declarations(root / "include"):
        total += 1
        seen.add(name)
        if re.search(r"\bks_error\s*\*", params):
            continue
        missing += 1
        if listing:
            print(f"{header}: {name}({params})")
        if name not in ALLOWED:
            bad.append(f"{header}: {name}")
    stale = sorted(set(ALLOWED) - seen)
    for name in bad:
        print(f"error_params: {name} returns ks_status without a ks_error parameter")
    for name in stale:
        print(f"error_params: allow-list entry {name} is no longer declared")
    print(f"error_params: {total} public functions return ks_status; {missing} take no ks_error "
          f"({len(ALLOWED)} allowed)")
    return 1 if bad or stale or total < 50 else 0


if __name__ == "__main__":
    sys.exit(main())
