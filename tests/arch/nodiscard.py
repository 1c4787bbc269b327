#!/usr/bin/env python3
"""Every function returning ks_status is KS_NODISCARD: header declarations and static definitions.

A dropped ks_status is a lost error, and KS_NODISCARD (warn_unused_result) makes it break
the -Werror build; this check makes a declaration without it break `make test`. It reads
the public headers (include/keepsake/*.h), the internal ones (src/**/*.h, python/src/*.h), and
the static functions of every source file of the library, the extension and the CLI (a static
helper's dropped status is lost just the same).
Exempt: ks__err and ks__err_at, which record the details of a failure being returned (their
result is the status the caller returns, often in a tail position), and function-pointer
types (a callback's result is the library's to use). Usage: nodiscard.py SOURCE_DIR [--list]
"""
import pathlib
import re
import sys

EXEMPT = {"ks__err", "ks__err_at"}
# A declaration or definition at file scope: return type ks_status, then the name and '('.
DECL = re.compile(r"(?:^|[;}])\s*((?:[A-Za-z_][A-Za-z0-9_]*\s+)*)ks_status\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.S)


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r"^\s*#[^\n]*(?:\\\n[^\n]*)*", " ", text, flags=re.M)  # preprocessor lines


def headers(root):
    yield from sorted((root / "include" / "keepsake").glob("*.h"))
    yield from sorted((root / "src").rglob("*.h"))
    yield from sorted((root / "python" / "src").glob("*.h"))
    for folder in ("src", "python/src", "tools"):
        yield from sorted((root / folder).rglob("*.c"))


def missing(root):
    for h in headers(root):
        text = strip(h.read_text())
        for m in DECL.finditer(text):
            quals, name = m.group(1).split(), m.group(2)
            if name in EXEMPT or "typedef" in quals:
                continue
            if h.suffix == ".c" and "static" not in quals:
                continue  # a definition of a function its header declares: the declaration counts
            if "KS_NODISCARD" not in quals:
                yield h.relative_to(root), name


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    bad = list(missing(root))
    seen = sum(1 for h in headers(root) for m in DECL.finditer(strip(h.read_text())))
    for path, name in bad:
        print(f"{path}: {name} returns ks_status without KS_NODISCARD")
    if seen < 100:  # the pattern stopped matching: a check that finds nothing proves nothing
        print(f"only {seen} ks_status declarations found; the pattern is broken")
        return 1
    print(f"{seen} ks_status declarations, {len(bad)} without KS_NODISCARD")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
