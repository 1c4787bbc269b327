"""The worked example of docs/PYTHON.md runs as written."""
import os
import re

SRC = os.environ.get("KS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def test_worked_example_runs(tmp_path, monkeypatch, capsys):
    text = open(os.path.join(SRC, "docs", "PYTHON.md"), encoding="utf-8").read()
    section = text.split("## A worked example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/PYTHON.md", "exec"), {"__name__": "example"})
    assert (tmp_path / "run.keepsake").exists()
    out = capsys.readouterr().out
    assert "  summary: " in out and "0 mismatched" in out


def test_manager_example_runs(tmp_path, monkeypatch, capsys):
    text = open(os.path.join(SRC, "docs", "PYTHON.md"), encoding="utf-8").read()
    section = text.split("## The checkpoint manager", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/PYTHON.md", "exec"), {"__name__": "example"})
    files = eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert "ep0-ba40.keepsake" in files and 2 <= len(files) <= 3  # keep_last 2 plus the best one
    exec(compile(code, "docs/PYTHON.md", "exec"), {"__name__": "example"})  # again: it resumes
    assert "loaded" in capsys.readouterr().out


def test_lightning_example_runs(tmp_path, monkeypatch, capsys):
    """The Lightning example: background saves, a resume with the metric states, and
    load_from_checkpoint with the hyperparameters."""
    import pytest
    pytest.importorskip("lightning.pytorch")
    import keepsake
    from keepsake.lightning import is_keepsake_file
    text = open(os.path.join(SRC, "docs", "PYTHON.md"), encoding="utf-8").read()
    section = text.split("## Lightning", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "async_save=True" in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/PYTHON.md", "exec"), {"__name__": "example"})
    assert is_keepsake_file(tmp_path / "ckpts" / "last.ckpt")
    keepsake.verify(tmp_path / "ckpts" / "last.ckpt")
    assert "samples counted: 192 width: 8" in capsys.readouterr().out  # 3 epochs of 64: resumed, not restarted


def test_data_position_example_runs(tmp_path, monkeypatch, capsys):
    """The exact data position example: a StatefulDataLoader with workers, stopped mid-epoch,
    resumed from the checkpoint into a loader seeded otherwise."""
    import pytest
    pytest.importorskip("torchdata.stateful_dataloader")
    text = open(os.path.join(SRC, "docs", "PYTHON.md"), encoding="utf-8").read()
    section = text.split("## Exact data position", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "num_workers=2" in code and "dataset_state=" in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/PYTHON.md", "exec"), {"__name__": "example"})
    assert "resumed at batch 9 of 18: exact" in capsys.readouterr().out


def _blocks(rel):
    text = open(os.path.join(SRC, rel), encoding="utf-8").read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    """Every Python block of README.md and python/README.md, each in a fresh directory."""
    blocks = [(rel, code) for rel in ("README.md", os.path.join("python", "README.md")) for code in _blocks(rel)]
    assert len(blocks) >= 2
    for i, (rel, code) in enumerate(blocks):
        d = tmp_path / str(i)
        d.mkdir()
        monkeypatch.chdir(d)
        exec(compile(code, rel, "exec"), {"__name__": "example"})
        out = capsys.readouterr().out
        if "load_checkpoint" in code:
            assert "  summary: " in out and "0 mismatched" in out, (rel, out)
        for name in ("run.keepsake", "ck.keepsake", "composer.keepsake"):  # each file a block names, it wrote
            assert f'"{name}"' not in code or (d / name).exists(), (rel, name)
        assert list(d.glob("*.keepsake")), rel


def test_readme_first_screen_is_a_pytorch_users(tmp_path, monkeypatch, capsys):
    """README.md's first 40 lines: pip install of the distribution, then a Python example that
    saves a model, AdamW and a torchmetrics metric mid-epoch and resumes them into new objects."""
    import tomllib

    import torch
    with open(os.path.join(SRC, "pyproject.toml"), "rb") as f:
        dist = tomllib.load(f)["project"]["name"]
    text = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
    head = "\n".join(text.splitlines()[:40])
    assert f"pip install {dist}" in head
    code = re.search(r"```python\n(.*?)```", head, re.S)
    assert code, "no complete Python example in the first 40 lines"
    code = code.group(1)
    assert "AdamW" in code and "torchmetrics" in code and ("load_checkpoint" in code or "CheckpointManager" in code)
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "example"}
    exec(compile(code, "README.md", "exec"), ns)
    assert "0 mismatched" in capsys.readouterr().out
    # Resumed into new objects: the weights, AdamW's moments and step, the metric's states.
    assert ns["model2"] is not ns["model"]
    for a, b in zip(ns["model"].state_dict().values(), ns["model2"].state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = ns["opt"].state_dict()["state"], ns["opt2"].state_dict()["state"]
    assert s1 and s1.keys() == s2.keys()
    for k in s1:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1[k][name], s2[k][name]), (k, name)
    m1, m2 = ns["metrics"]["acc"], ns["metrics2"]["acc"]
    assert m2.update_count == m1.update_count == 1
    for name in m1._defaults:
        assert torch.equal(getattr(m1, name), getattr(m2, name)), name


def test_readme_code_fences_close_on_their_own_line():
    """A closing fence followed by text leaves the block open on GitHub, rendering what follows as code."""
    for rel in ("README.md", os.path.join("python", "README.md"), os.path.join("docs", "PYTHON.md")):
        lines = open(os.path.join(SRC, rel), encoding="utf-8").read().splitlines()
        fences = [(i + 1, l) for i, l in enumerate(lines) if l.lstrip().startswith("```")]
        bad = [(i, l) for i, l in fences if not re.fullmatch(r"\s*```[\w+-]*", l)]
        assert not bad, (rel, bad)
        assert len(fences) % 2 == 0, (rel, "unbalanced fences")
