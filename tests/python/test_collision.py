"""The package refuses to run beside the package index's other `keepsake` (keepsake/_collision.py).

`pip install keepsake` installs Replicate's "Version control for machine learning", whose import
package and command are named `keepsake` too; pip mixes both projects' files in one folder. Each
case copies the package under test into a folder of its own, adds what the other project's
install leaves there, and imports it in a subprocess.
"""
import os
import shutil
import subprocess
import sys
import tomllib

import keepsake
import keepsake._cli

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
PKG = os.path.dirname(os.path.abspath(keepsake.__file__))

# What Replicate's keepsake 0.4.2 wheel installs beside the package (its dist-info, abridged: the real
# METADATA has the long description after these lines, top_level.txt also names `tests`).
OTHER_METADATA = """Metadata-Version: 2.1
Name: keepsake
Version: 0.4.2
Summary: Version control for machine learning
Home-page: https://keepsake.ai
Requires-Python: >=3.6.0
"""
OTHER_INIT = '''from .project import Project, init
from .version import version as __version__

default_project = Project()
experiments = default_project.experiments
'''


def site_with_package(tmp_path, name="site"):
    site = tmp_path / name
    shutil.copytree(PKG, site / "keepsake", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def add_other_dist(site, top_level=True):
    info = site / "keepsake-0.4.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(OTHER_METADATA)
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-manylinux1_x86_64\n")
    if top_level:
        (info / "top_level.txt").write_text("keepsake\ntests\n")
    (info / "RECORD").write_text("keepsake/__init__.py,,\nkeepsake/project.py,,\nkeepsake/version.py,,\n"
                                 "../../../bin/keepsake,,\nkeepsake-0.4.2.dist-info/RECORD,,\n")
    (site / "keepsake" / "version.py").write_text('version = "0.4.2"\n')


def run(site, code):
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def assert_refused(r, *words):
    assert r.returncode != 0, r.stdout
    last = r.stderr.strip().splitlines()
    text = r.stderr[r.stderr.index("ImportError: keepsake: "):] if "ImportError: keepsake: " in r.stderr else ""
    assert text, r.stderr
    for w in words + ("pip uninstall -y keepsake keepsake-ckpt && pip install keepsake-ckpt",):
        assert w in text, (w, last[-8:])


def test_the_distribution_name_is_the_projects():
    with open(os.path.join(SRC, "pyproject.toml"), "rb") as f:
        name = tomllib.load(f)["project"]["name"]
    assert name == keepsake.__distribution__ == keepsake._collision.DISTRIBUTION == "keepsake-ckpt"


def test_the_command_names_the_distribution():
    """`keepsake --version` (the C CLI, as the console script runs it) says which project it is."""
    cli = os.environ.get("KS_CLI") or keepsake._cli.executable()
    for argv in ([cli, "--version"], [sys.executable, "-m", "keepsake", "--version"]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"keepsake {keepsake.__version__} (keepsake-ckpt)\n", (argv, r.stdout)


def test_alone_it_imports(tmp_path):
    site = site_with_package(tmp_path)
    (site / "keepsake_ckpt-0.1.0.dist-info").mkdir()  # its own dist-info
    (site / "keepsake_ckpt-0.1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.4\nName: keepsake-ckpt\n"
                                                                      "Version: 0.1.0\n")
    (site / "keepsakes_unrelated-1.0.dist-info").mkdir()  # a name that starts alike, claiming nothing of ours
    (site / "keepsakes_unrelated-1.0.dist-info" / "top_level.txt").write_text("keepsakes_unrelated\n")
    r = run(site, "import keepsake, keepsake.torch, os; print(os.path.dirname(keepsake.__file__))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(site / "keepsake")


def test_the_other_projects_dist_beside_it_is_refused(tmp_path):
    """Ours installed last: our __init__ runs, the other's dist-info claims the same folder."""
    site = site_with_package(tmp_path)
    add_other_dist(site)
    r = run(site, "import keepsake")
    assert_refused(r, "keepsake 0.4.2", "Version control for machine learning", "share")
    # The command (python -m keepsake, and the console script's module) says the same.
    assert_refused(run(site, "import runpy; runpy.run_module('keepsake', run_name='__main__')"), "keepsake 0.4.2")
    assert_refused(run(site, "from keepsake._cli import main"), "keepsake 0.4.2")


def test_a_dist_with_only_a_record_is_found(tmp_path):
    site = site_with_package(tmp_path)
    add_other_dist(site, top_level=False)
    assert_refused(run(site, "import keepsake"), "keepsake 0.4.2")


def test_the_other_projects_init_over_ours_is_refused(tmp_path):
    """The other installed last: its __init__ replaced ours; our public modules, still there, refuse."""
    site = site_with_package(tmp_path)
    add_other_dist(site)
    (site / "keepsake" / "__init__.py").write_text("from .version import version as __version__\n")
    for mod in ("keepsake.torch", "keepsake.numpy", "keepsake.lightning", "keepsake._cli"):
        r = run(site, f"import {mod}")
        assert_refused(r, "its __init__.py belongs to another project", "keepsake 0.4.2")
    # Without the other's dist-info (removed by hand, say), the message still says what happened.
    shutil.rmtree(site / "keepsake-0.4.2.dist-info")
    assert_refused(run(site, "import keepsake.torch"), "is not keepsake-ckpt's", "Version control for machine learning")


def test_a_missing_extension_says_so(tmp_path):
    site = site_with_package(tmp_path)
    for f in (site / "keepsake").glob("_keepsake*.so"):
        f.unlink()
    r = run(site, "import keepsake")
    assert r.returncode != 0
    assert "ImportError: keepsake: keepsake-ckpt's C extension keepsake._keepsake does not import" in r.stderr, r.stderr
    assert "pip install --force-reinstall keepsake-ckpt" in r.stderr


def test_the_check_is_cheap_on_a_crowded_folder(tmp_path):
    """Only entries named keepsake* are read: a thousand other dist-infos cost one listing."""
    site = site_with_package(tmp_path)
    for i in range(1000):
        d = site / f"pkg{i}-1.0.dist-info"
        d.mkdir()
        (d / "top_level.txt").write_text(f"pkg{i}\n")
    code = ("import time, keepsake._collision as c; t = time.perf_counter(); n = 0\n"
            "for _ in range(20): n += len(c.foreign_distributions(c.__file__))\n"
            "print(n, (time.perf_counter() - t) / 20)")
    r = run(site, code)
    assert r.returncode == 0, r.stderr
    n, seconds = r.stdout.split()
    assert n == "0" and float(seconds) < 0.02, r.stdout
