"""The C extension's stub, python/keepsake/_keepsake.pyi, against the built extension.

Runs mypy's stubtest (pinned in scripts/requirements-test.txt) on keepsake._keepsake as the
PYTHONPATH has it (the build tree's copy of the package, stub included), with no allowlist:
every name the extension has is in the stub and the other way round, with the same parameters,
kinds and defaults (the extension's signatures come from its docstrings' text signatures).
Exits 77 (skipped) when this Python has no mypy.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile

if importlib.util.find_spec("mypy") is None:
    print("mypy is not installed in this Python: scripts/install-deps installs the pinned one", file=sys.stderr)
    sys.exit(77)
with tempfile.TemporaryDirectory() as tmp:  # mypy's cache goes there, not into the build tree
    env = dict(os.environ, MYPY_CACHE_DIR=os.path.join(tmp, "cache"))
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "keepsake._keepsake"], cwd=tmp, env=env,
                       capture_output=True, text=True)
print(r.stdout + r.stderr)
sys.exit(0 if r.returncode == 0 and "Success: no issues found in 1 module" in r.stdout else 1)
