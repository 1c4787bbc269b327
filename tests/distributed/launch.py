"""How the tests of this folder start their jobs: a command with a deadline (its whole process
group killed when it passes) and the tails of its output when it ends other than expected, and
torchrun's command line for a script of this folder (gloo on CPU: one thread per rank, no
restarts, a free port). Standard library only."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import List, Optional


def run(cmd: List[str], *, what: Optional[str] = None, expect_ok: bool = True,
        timeout: int = 100) -> subprocess.CompletedProcess:
    """Runs cmd; AssertionError (after printing the tails of its output) when it does not exit
    within `timeout` s, or succeeds or fails other than `expect_ok` says."""
    what = what or " ".join(cmd)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    # A session of its own: on a timeout the workers go too, not only their launcher.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        sys.stdout.write(out[-6000:])
        sys.stderr.write(err[-6000:])
        raise AssertionError(f"{what}: no exit after {timeout} s") from None
    if (proc.returncode == 0) != expect_ok:
        sys.stdout.write(out[-6000:])
        sys.stderr.write(err[-8000:])
        raise AssertionError(f"{what}: exit {proc.returncode}, expected {'success' if expect_ok else 'failure'}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(n: int, script: str, *args: str, expect_ok: bool = True,
             timeout: int = 100) -> subprocess.CompletedProcess:
    """`script args...` on n ranks under torchrun (see run)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--rdzv-backend=c10d",
           "--rdzv-endpoint=127.0.0.1:0", "--max-restarts=0", os.path.abspath(script), *args]
    return run(cmd, what=f"torchrun {' '.join(args)}", expect_ok=expect_ok, timeout=timeout)


def require(*modules: str) -> None:
    """Exits 77 (ctest: skipped) unless each module imports and torch.distributed has gloo."""
    import importlib
    try:
        for m in ("torch.distributed", *modules):
            importlib.import_module(m)
    except Exception as e:  # noqa: BLE001 - any import failure means no test here
        print(f"skipped: {e}")
        sys.exit(77)
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        print("skipped: torch.distributed with gloo unavailable")
        sys.exit(77)


def workdir(prefix: str) -> str:
    """A fresh scratch directory under $KS_DCP_WORK (the build tree's, set by ctest) or the temp dir."""
    root = os.environ.get("KS_DCP_WORK") or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=root)
