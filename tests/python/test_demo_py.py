"""The Python demo (examples/python/digits_train.py, which `make demo` runs): SIGKILLed mid-epoch
and resumed with CheckpointManager.autoresume(), it ends bit-identical to an uninterrupted run."""
import os
import signal
import subprocess
import sys

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(SRC, "examples", "python", "digits_train.py")


def run(*args):
    return subprocess.run([sys.executable, DEMO, *args], capture_output=True, text=True)


def why(cli, a, b, killed, resumed):
    """What a failure report needs: the runs' progress lines, the files, and whether the checkpoint
    the resumed run started from already differs from the uninterrupted run's of that name."""
    import re
    out = ["", "killed run:", killed.stdout[-1500:], "resumed run:", resumed.stdout[-1500:],
           f"A: {sorted(os.listdir(a))}", f"B: {sorted(os.listdir(b))}"]
    m = re.search(r"resumed from (\S+\.keepsake)", resumed.stdout)
    if m and os.path.exists(os.path.join(a, m.group(1))):
        d = subprocess.run([cli, "diff", os.path.join(a, m.group(1)), os.path.join(b, m.group(1)), "--ignore", "*_wct"],
                           capture_output=True, text=True)
        out += [f"{m.group(1)} of A against B's:", d.stdout[-3000:]]
    return "\n".join(out)


def test_killed_and_resumed_python_run_is_identical(tmp_path):
    a, b = str(tmp_path / "A"), str(tmp_path / "B")
    assert run("--run-dir", a, "--epochs", "3").returncode == 0
    killed = run("--run-dir", b, "--epochs", "3", "--kill-after", "70")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not os.path.exists(os.path.join(b, "final.keepsake"))
    resumed = run("--run-dir", b, "--epochs", "3", "--autoresume")
    assert resumed.returncode == 0, resumed.stderr
    assert "keepsake: resumed from ep" in resumed.stdout
    cli = os.environ.get("KS_CLI")
    if cli:
        d = subprocess.run([cli, "diff", os.path.join(a, "final.keepsake"), os.path.join(b, "final.keepsake"),
                            "--ignore", "*_wct"], capture_output=True, text=True)
        assert d.returncode == 0 and "identical:" in d.stdout, d.stdout + d.stderr + why(cli, a, b, killed, resumed)
    import torch
    import keepsake.torch as kt
    fa, fb = (kt.load_file(os.path.join(p, "final.keepsake"), backend="read") for p in (a, b))
    assert sorted(fa) == sorted(fb)
    for k in fa:
        if not k.endswith("_wct"):
            assert torch.equal(fa[k], fb[k]), k
