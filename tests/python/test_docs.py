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
        assert (d / "ck.keepsake").exists() and (d / "composer.keepsake").exists(), rel
