"""load_checkpoint resumes in place: the model's tensors and an optimizer's existing state tensors
take the file's bytes in their own memory and stay the same Python objects; a damaged tensor
changes nothing, bit for bit; and what an optimizer holds afterwards is what torch.load +
load_state_dict gives it (SGD with momentum, AdamW, Adam with amsgrad), fresh or in place."""
import copy

import pytest
import torch

import keepsake
import keepsake.torch as kt
from keepsake import _keepsake

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.05),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True),
}


def net():
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.BatchNorm1d(12), torch.nn.Linear(12, 3))


def train(model, opt, seed, steps=2):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(7, 6, generator=g)).pow(2).sum().backward()
        opt.step()


def state_tensors(opt):
    return {(i, k): v for i, st in enumerate(opt.state.values()) for k, v in st.items() if isinstance(v, torch.Tensor)}


def bits(t):
    return t.detach().clone().reshape(-1).view(torch.uint8) if t.numel() else t.detach().clone()


def assert_state_dicts_equal(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert list(a["state"]) == list(b["state"])
    for i in a["state"]:
        sa, sb = a["state"][i], b["state"][i]
        assert list(sa) == list(sb), i
        for k in sa:
            assert isinstance(sb[k], type(sa[k])), (i, k)
            if isinstance(sa[k], torch.Tensor):
                assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, (i, k)
                assert sa[k].device == sb[k].device, (i, k)
                assert torch.equal(sa[k], sb[k]), (i, k)
            else:
                assert sa[k] == sb[k], (i, k)


@pytest.mark.parametrize("which", sorted(OPTIMIZERS))
@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "in_place"])
def test_optimizer_state_matches_torch_load(tmp_path, which, existing):
    torch.manual_seed(0)
    model = net()
    opt = OPTIMIZERS[which](model.parameters())
    train(model, opt, 1)
    ks, pt = str(tmp_path / "c.keepsake"), str(tmp_path / "c.pt")
    kt.save_checkpoint(ks, model=model, optimizers=opt, rng=False)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, pt)

    def resumed():
        torch.manual_seed(5)
        m = net()
        o = OPTIMIZERS[which](m.parameters())
        if existing:  # the program has stepped already: its state tensors exist, with other values
            train(m, o, 9, steps=1)
        return m, o

    m1, o1 = resumed()
    kt.load_checkpoint(ks, model=m1, optimizers=o1, rng=False)
    m2, o2 = resumed()
    ck = torch.load(pt, weights_only=True)
    m2.load_state_dict(ck["model"])
    o2.load_state_dict(ck["optimizer"])
    assert_state_dicts_equal(o1.state_dict(), o2.state_dict())
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    assert all(type(g["params"]) is list for g in o1.param_groups)
    train(m1, o1, 4)  # and both go on alike
    train(m2, o2, 4)
    assert_state_dicts_equal(o1.state_dict(), o2.state_dict())


def test_tensors_stay_the_same_objects(tmp_path):
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, 1)
    p = str(tmp_path / "c.keepsake")
    kt.save_checkpoint(p, model=model, optimizers=opt, rng=False)
    saved = {k: v.clone() for k, v in state_tensors(opt).items()}
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, opt, 2)  # the program moves on; then resumes from the file
    params = {k: v for k, v in model.named_parameters()}
    buffers = {k: v for k, v in model.named_buffers()}
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    state = state_tensors(opt)
    kt.load_checkpoint(p, model=model, optimizers=opt, rng=False)
    assert all(v is params[k] for k, v in model.named_parameters())
    assert all(v is buffers[k] for k, v in model.named_buffers())
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == ptrs
    now = state_tensors(opt)
    assert now.keys() == state.keys()
    for k, v in now.items():
        assert v is state[k], k  # the same tensor, filled in place
        assert torch.equal(v, saved[k]), k
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved_model[k]), k


def flip_byte(path, name):
    _, _, _, begin, end = _keepsake.Reader(path, lazy=True).entry(name)
    at = (begin + end) // 2
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("damaged", ["state/model/2.weight", "state/optimizers/AdamW/state/3/exp_avg_sq",
                                     "state/model/1.running_mean"])
def test_a_damaged_tensor_leaves_the_program_unchanged_bit_for_bit(tmp_path, damaged):
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, 1)
    p = str(tmp_path / "c.keepsake")
    kt.save_checkpoint(p, model=model, optimizers=opt, rng=False)
    flip_byte(p, damaged)
    train(model, opt, 2)
    model_bits = {k: bits(v) for k, v in model.state_dict().items()}
    state = state_tensors(opt)
    state_bits = {k: bits(v) for k, v in state.items()}
    groups = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    with pytest.raises(keepsake.ChecksumError) as e:
        kt.load_checkpoint(p, model=model, optimizers=opt, rng=False)
    assert damaged in str(e.value)
    for k, v in model.state_dict().items():
        assert torch.equal(bits(v), model_bits[k]), k
    now = state_tensors(opt)
    assert now.keys() == state.keys()
    for k, v in now.items():
        assert v is state[k] and torch.equal(bits(v), state_bits[k]), k
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups


class CopyingSGD(torch.optim.SGD):
    """An optimizer whose load_state_dict keeps copies of what it is given."""

    def load_state_dict(self, state_dict):
        super().load_state_dict(copy.deepcopy(state_dict))


def test_an_object_that_keeps_copies_still_gets_the_files_values(tmp_path):
    torch.manual_seed(0)
    model = net()
    opt = CopyingSGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, 1)
    p = str(tmp_path / "c.keepsake")
    kt.save_checkpoint(p, model=model, optimizers={"sgd": opt}, rng=False)
    want = {k: v.clone() for k, v in state_tensors(opt).items()}
    train(model, opt, 2)
    kt.load_checkpoint(p, model=model, optimizers={"sgd": opt}, rng=False)
    now = state_tensors(opt)
    for k, v in want.items():
        assert torch.equal(now[k], v), k


def test_a_refused_optimizer_state_is_not_filled(tmp_path):
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, 1)
    p = str(tmp_path / "c.keepsake")
    kt.save_checkpoint(p, model=model, optimizers={"sgd": opt}, rng=False)
    train(model, opt, 2)
    before = {k: bits(v) for k, v in state_tensors(opt).items()}
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})  # now 2 groups: torch refuses
    report = kt.load_checkpoint(p, model=model, optimizers={"sgd": opt}, rng=False, strict=False)
    assert "state/optimizers/sgd" in report.paths("mismatched")
    for k, v in state_tensors(opt).items():
        assert torch.equal(bits(v), before[k]), k


def test_param_ids_answer_in_from_a_set_and_copy_as_a_list():
    from keepsake._state import inplace
    ids = inplace._ParamIds(range(5))
    assert 3 in ids and 7 not in ids and [] not in ids
    assert type(copy.deepcopy(ids)) is list and copy.deepcopy(ids) == [0, 1, 2, 3, 4]
    value = {"param_groups": [{"params": [0, 1]}, {"params": ["a"]}], "state": {}}
    inplace._fast_groups(value)
    assert type(value["param_groups"][0]["params"]) is inplace._ParamIds
    assert type(value["param_groups"][1]["params"]) is list
