"""The files the package writes for a training state keep their headers: the same keys, dtypes,
shapes and metadata records as tests/fixtures/state_header (made by its make_state_header.py),
whoever names the keys. save_checkpoint, CheckpointManager and KeepsakeCheckpointIO are covered."""
import importlib.util
import json
import os
import pathlib

import pytest

pytest.importorskip("torchmetrics")
pytest.importorskip("lightning")

SOURCE = pathlib.Path(os.environ.get("KS_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
FIXTURES = SOURCE / "tests" / "fixtures" / "state_header"


def _generator():
    spec = importlib.util.spec_from_file_location("make_state_header", FIXTURES / "make_state_header.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def headers():
    return _generator().headers()


@pytest.fixture(scope="module")
def expected():
    return json.loads((FIXTURES / "state_header.expected.json").read_text())


@pytest.mark.parametrize("how", ["save_checkpoint", "manager", "lightning"])
def test_entries_as_committed(headers, expected, how):
    assert headers[how]["entries"] == expected[how]["entries"]


@pytest.mark.parametrize("how", ["save_checkpoint", "manager", "lightning"])
def test_metadata_as_committed(headers, expected, how):
    got, want = headers[how]["metadata"], expected[how]["metadata"]
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], k


def test_fixture_covers_the_layout(expected):
    """The fixture holds every part whose key the library names (so the comparison means something)."""
    keys = " ".join(expected["save_checkpoint"]["entries"])
    for part in ("/_computed", "/state_dict/", "/attrs/", "/inner/", "state/optimizers/AdamW/",
                 "state/eval_metrics/val/mse/", "state/extra/w", "rng/0/"):
        assert part in keys, part
    assert expected["save_checkpoint"]["metadata"]["keepsake.state"] == '{"layout_version":1}'
    assert expected["lightning"]["metadata"]["keepsake.lightning"] == '{"layout_version": 1}'


def test_state_key_is_the_library_rule_and_refuses_bad_parts():
    """keepsake._core.layout asks the library (ks_state_key); bad parts raise, never crash."""
    import keepsake
    from keepsake._core import layout, native

    assert layout.key(layout.OPTIMIZER, "AdamW") == "state/optimizers/AdamW"
    assert layout.key(layout.METRIC_INNER, "_base_metric", base="state/train_metrics/mm") == \
        "state/train_metrics/mm/inner/_base_metric"
    assert layout.folder(layout.EVAL_METRIC, "val") == "state/eval_metrics/val/"
    assert layout.COMPUTED == "_computed"
    assert layout.STATE_RECORD == ("keepsake.state", '{"layout_version":1}')
    for part in (-1, 18, 1 << 40):
        with pytest.raises((keepsake.KeepsakeError, OverflowError)):
            native.state_key(part, None, "x")
    with pytest.raises(keepsake.KeepsakeError):
        native.state_key(layout.METRIC_STATE, None, "tp")  # a metric's part needs its path
    with pytest.raises(keepsake.KeepsakeError):
        native.state_key(layout.RUN_NAME, None, "x")  # takes no name
    with pytest.raises(keepsake.KeepsakeError):
        native.state_key(layout.MODEL, None, "w" * 5000)
    with pytest.raises(TypeError):
        native.state_key(layout.MODEL, None, 3)
    with pytest.raises(KeyError):
        native.layout_record("keepsake.metrics")
