"""Every public function, method, property and class of the public modules has a docstring.

The public modules are the package and every module or sub-package under it whose name has no
leading underscore (found by walking the package, so new ones are covered); their public names are
``__all__`` where a module has one, else the names it defines without a leading underscore. A
method counts when it is defined in the class itself: an override needs its own docstring, saying
what keepsake's version does.
"""
import importlib
import inspect
import pkgutil

import keepsake


def public_modules():
    mods = [keepsake]
    for info in pkgutil.walk_packages(keepsake.__path__, "keepsake."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            mods.append(importlib.import_module(info.name))
    return mods


def public_names(mod):
    names = getattr(mod, "__all__", None)
    if names is not None:
        return list(names)
    return [n for n, v in vars(mod).items() if not n.startswith("_") and getattr(v, "__module__", None) == mod.__name__]


def documented(obj):
    return bool((getattr(obj, "__doc__", None) or "").strip())


def undocumented(mod):
    out = []
    for name in public_names(mod):
        obj = getattr(mod, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            continue  # constants
        if not (getattr(obj, "__module__", "") or "").startswith("keepsake"):
            continue  # re-exported from elsewhere
        where = f"{mod.__name__}.{name}"
        if not documented(obj):
            out.append(where)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                if isinstance(value, property) or inspect.isfunction(fn) or inspect.ismethoddescriptor(fn):
                    if not documented(fn):
                        out.append(f"{where}.{attr}")
    return out


def test_the_walk_finds_the_public_modules():
    names = {m.__name__ for m in public_modules()}
    assert {"keepsake", "keepsake.torch", "keepsake.numpy", "keepsake.lightning", "keepsake.distributed"} <= names
    assert not any(n.split(".")[-1].startswith("_") for n in names)


def test_the_check_sees_a_missing_docstring():
    """The check itself: a public method without a docstring, and an override without one, are found."""
    import types

    class Base:
        def hook(self):
            """The base's docstring (not the override's)."""

    class Documented(Base):
        """A class."""

        def ok(self):
            """Documented."""

        def bare(self):
            pass

        def hook(self):
            pass

        @property
        def size(self):
            return 0

        def _private(self):
            pass

    mod = types.ModuleType("keepsake.fake")
    mod.__all__ = ["Documented", "f"]
    mod.Documented = Documented
    mod.f = lambda: None
    Documented.__module__ = mod.f.__module__ = "keepsake.fake"
    assert sorted(undocumented(mod)) == ["keepsake.fake.Documented.bare", "keepsake.fake.Documented.hook",
                                         "keepsake.fake.Documented.size", "keepsake.fake.f"]


def test_every_public_callable_has_a_docstring():
    missing = [w for m in public_modules() for w in undocumented(m)]
    assert not missing, "no docstring: " + ", ".join(sorted(set(missing)))
