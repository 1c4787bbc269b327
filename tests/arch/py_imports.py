#!/usr/bin/env python3
"""The Python package's imports: no cycle, and no layer importing a higher one.

Every module of python/keepsake (sub-packages included) is parsed with ``ast``; every ``import``
and ``from ... import`` anywhere in it (inside functions and classes too, and
``importlib.import_module`` / ``__import__`` of a literal name) that names one of the package's
modules is an edge of the module graph. The check fails on:

- a cycle in that graph (each is printed);
- an edge from a module to a module of a higher layer (LAYERS, lowest first: a module may import
  its own layer and the layers before it);
- a module in no layer (a new module is placed in LAYERS, and docs/DESIGN.md says where);
- an import of the C extension (keepsake._keepsake) from outside keepsake._core and the package's
  own __init__ (which turns a missing extension into an installation message): everything else
  goes through keepsake._core.native;
- a layer's ``__init__`` (keepsake/_core/__init__.py ...) that imports one of the package's
  modules (importing any module of a layer runs it: it must pull in nothing);
- an import of a module of the package that does not exist.

The checker first runs on a small package written to a temporary folder, where it must find a
cycle made by an import inside a function, an upward import and an unplaced module.
Usage: py_imports.py SOURCE_DIR
"""
import ast
import pathlib
import sys
import tempfile

# Lowest first. An entry names a module, or a sub-package and every module in it.
LAYERS = [
    ("the C extension", ["keepsake._keepsake"]),
    ("core", ["keepsake._core"]),
    ("the installation check", ["keepsake._collision"]),
    ("tensor files", ["keepsake._files"]),
    ("training state", ["keepsake._state"]),
    ("checkpoint manager", ["keepsake._manager"]),
    ("torch.distributed", ["keepsake._distributed"]),
    ("integrations", ["keepsake._integrations"]),
    ("public modules", ["keepsake", "keepsake.__main__", "keepsake._cli", "keepsake.torch", "keepsake.numpy",
                        "keepsake.lightning", "keepsake.distributed", "keepsake.distributed_import"]),
]
EXTENSION = "keepsake._keepsake"
EXTENSION_USERS = ("keepsake._core", "keepsake")  # the layer's modules, and the package __init__ only


def modules(pkg_dir):
    """{module name: (path, is a package)} of every .py under pkg_dir; a .pyi alone (the C
    extension's stub) names a module too."""
    root = pkg_dir.parent
    out = {}
    for p in sorted(pkg_dir.rglob("*.py")) + sorted(pkg_dir.rglob("*.pyi")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_pkg else parts)
        if p.suffix == ".pyi":
            out.setdefault(name, (None, False))
        else:
            out[name] = (p, is_pkg)
    return out


def _literal_import(node):
    """The module name of ``importlib.import_module("x")`` / ``__import__("x")``, or None."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def imports(name, path, is_pkg, mods, problems):
    """The package's modules that module `name` imports, anywhere in its file."""
    top = name.split(".")[0]
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()

    def add(target, line):
        if target in mods:
            found.add(target)
        else:
            problems.append(f"{path}:{line}: imports {target}, which is no module of the package")

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == top:
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin.split(".")[0] != top:
                continue
            for alias in node.names:  # a submodule, or a name of the module `origin`
                sub = f"{origin}.{alias.name}"
                add(sub if sub in mods else origin, node.lineno)
        else:
            literal = _literal_import(node)
            if literal and literal.split(".")[0] == top:
                add(literal, node.lineno)
    found.discard(name)
    return found


def layer_of(name):
    for i, (_title, entries) in enumerate(LAYERS):
        for e in entries:
            if name == e or (e != e.split(".")[0] and name.startswith(e + ".")):
                return i
    return None


def cycles(graph):
    """Every elementary cycle, each once (starting at its smallest module)."""
    found = []

    def walk(start, node, path, on_path):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in on_path:
                on_path.add(nxt)
                walk(start, nxt, path + [nxt], on_path)
                on_path.discard(nxt)

    for start in sorted(graph):
        walk(start, start, [start], {start})
    return found


def check(pkg_dir):
    """(problems, graph) for the package in pkg_dir."""
    mods = modules(pkg_dir)
    problems = []
    graph = {name: imports(name, p, is_pkg, mods, problems) for name, (p, is_pkg) in mods.items() if p}
    for c in cycles(graph):
        problems.append("import cycle: " + " -> ".join(c))
    for name in sorted(mods):
        if layer_of(name) is None:
            problems.append(f"{name}: in no layer (place it in LAYERS, tests/arch/py_imports.py)")
    for name, deps in sorted(graph.items()):
        mine = layer_of(name)
        for d in sorted(deps):
            theirs = layer_of(d)
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(f"{name} ({LAYERS[mine][0]}) imports {d} ({LAYERS[theirs][0]}), a higher layer")
            if d == EXTENSION and not (name == "keepsake" or name.startswith(EXTENSION_USERS[0] + ".")):
                problems.append(f"{name} imports the C extension {EXTENSION}: use keepsake._core.native")
        if mods[name][1] and name.rpartition(".")[2].startswith("_") and deps:
            problems.append(f"{name}/__init__.py imports {', '.join(sorted(deps))}: a layer's __init__ "
                            "imports nothing of the package")
    return problems, graph


FAKE = {  # a package with one of each fault the check must find
    "__init__.py": "from ._core import a\n",
    "_core/__init__.py": "from . import a  # a layer's __init__ imports nothing\n",
    "_core/a.py": "def f():\n    from .._state import b  # upward, and half of a cycle\n",
    "_state/__init__.py": "",
    "_state/b.py": "from .._core import a\n",
    "_stray.py": "",
}


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        pkg = pathlib.Path(tmp) / "keepsake"
        for rel, text in FAKE.items():
            (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
            (pkg / rel).write_text(text)
        problems, _ = check(pkg)
    text = "\n".join(problems)
    want = ["import cycle: keepsake._core.a -> keepsake._state.b -> keepsake._core.a",
            "keepsake._core.a (core) imports keepsake._state.b (training state), a higher layer",
            "keepsake._stray: in no layer",
            "keepsake._core/__init__.py imports keepsake._core.a: a layer's __init__ imports nothing"]
    missed = [w for w in want if w not in text]
    if missed:
        print("the check itself is broken: on its test package it did not report:\n  " + "\n  ".join(missed)
              + "\nit reported:\n  " + text.replace("\n", "\n  "))
    return not missed


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    if not self_test():
        return 1
    problems, graph = check(root / "python" / "keepsake")
    for p in problems:
        print(p)
    edges = sum(len(d) for d in graph.values())
    print(f"{len(graph)} modules, {edges} imports, {len(LAYERS)} layers: {len(problems)} problems")
    return 1 if problems or len(graph) < 20 else 0


if __name__ == "__main__":
    sys.exit(main())
