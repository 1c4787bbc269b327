"""Host staging of device tensors (keepsake.torch.HostStaging) without a GPU.

The staging's allocator, device predicate, copy and wait are injected: a plain CPU allocator that
counts its chunks, tensors marked "device" by a predicate, and a wait that counts its calls. So
the staging's bookkeeping is checked here - which tensors go through it, that the saved bytes are
the source's, one wait per device per save, the same addresses from one save to the next, growth,
release on close(), failed saves - and tests/gpu/cuda_paths.py checks the real CUDA copies.
"""
import gc
import weakref

import pytest
import torch
import torchmetrics as tm

import keepsake
import keepsake.torch as kt
from keepsake._core import tensors as _tensors
from keepsake._state import staging as _staging


class Fake:
    """A CPU stand-in for the CUDA defaults: `device` tensors are those over a marked tensor's memory
    (state_dict() and the optimizer give detached tensors over the parameters' own)."""

    def __init__(self):
        self.marked = set()
        self.chunks = []  # weak references to every chunk allocated
        self.copies = 0
        self.syncs = []

    def alloc(self, n):
        t = torch.empty(n, dtype=torch.uint8)
        self.chunks.append(weakref.ref(t))
        return t

    def is_device(self, t):
        return t.untyped_storage().data_ptr() in self.marked

    def copy(self, dst, src):
        self.copies += 1
        dst.copy_(src)

    def sync(self, device):
        self.syncs.append(str(device))

    def staging(self, exclusive=False):
        return kt.HostStaging(alloc=self.alloc, is_device=self.is_device, copy=self.copy, sync=self.sync,
                              exclusive=exclusive)

    def mark(self, *ts):
        for t in ts:
            self.marked.add(t.untyped_storage().data_ptr())

    def live(self):
        gc.collect()
        return sum(1 for r in self.chunks if r() is not None)


def model_on_device(fake, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fake.mark(*m.parameters())
    return m


def inside(st, ptr):
    b = st.buffer
    return b is not None and b.data_ptr() <= ptr < b.data_ptr() + b.numel()


def spy_staged(st):
    """Records, at each stage(), the (name, address) of every entry it pointed into the buffer."""
    saves = []
    real, real_image = st.stage, st.stage_image

    def stage(entries):
        real(entries)
        saves.append([(e[0], e[3]) for e in entries if len(e) == 5 and inside(st, e[3])])

    def stage_image(entries, place):
        real_image(entries, place)
        saves.append([(e[0], e[3]) for e in entries if len(e) == 5 and inside(st, e[3])])
    st.stage, st.stage_image = stage, stage_image
    return saves


def test_only_device_tensors_are_staged_and_the_bytes_are_the_sources(tmp_path):
    fake = Fake()
    st = fake.staging()
    dev = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    odd = {"bf16": torch.arange(6, dtype=torch.bfloat16), "flags": torch.tensor([True, False, True]),
           "c64": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64), "scalar": torch.tensor(7, dtype=torch.int64),
           "strided": torch.arange(20, dtype=torch.int16).reshape(4, 5).t(), "conj": torch.tensor([1 + 1j]).conj(),
           "empty": torch.zeros(0, 3)}
    host = torch.ones(5)
    fake.mark(dev, *odd.values())
    keep = []
    entries = [st.entry("dev", dev, keep), st.entry("host", host, keep)]
    assert entries[1] == _tensors.torch_entry("host", host, [])  # exactly as today, its own memory
    assert entries[1][3] == host.data_ptr()
    entries += [st.entry(k, v, keep) for k, v in odd.items()]
    assert fake.copies == 0 and st.allocations == 0  # nothing copied while the state is flattened
    st.stage(entries)
    assert fake.copies == 1 + len(odd) - 1  # the empty tensor is not copied
    assert fake.syncs == ["cpu"]  # one wait for the save, whatever the number of tensors
    assert st.allocations == 1 and st.nbytes == _staging.GRAIN
    staged = [e for e in entries if inside(st, e[3])]
    assert [e[0] for e in staged] == ["dev", "bf16", "flags", "c64", "scalar", "strided", "conj"]
    assert all(e[3] % _staging.ALIGN == 0 for e in staged)
    assert entries[0][:3] == ("dev", _tensors.CODES["F32"], (3, 4)) and entries[0][4] == 48
    keepsake._keepsake.save_file(str(tmp_path / "x.keepsake"), entries, None, None, False)
    st.done()
    got = kt.load_file(tmp_path / "x.keepsake")
    want = dict(odd, dev=dev, host=host)
    want["conj"] = want["conj"].resolve_conj()
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
    t = torch.zeros(2, dtype=torch.complex128)
    fake.mark(t)
    with pytest.raises(keepsake.DTypeError):
        st.entry("bad", t, [])


@pytest.mark.parametrize("exclusive", [False, True])
def test_manager_reuses_the_staging_across_saves_and_frees_it_on_close(tmp_path, exclusive):
    fake = Fake()
    st = fake.staging(exclusive)
    model = model_on_device(fake)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    fake.mark(*[v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()])
    ts = keepsake.Timestamp()
    saves = spy_staged(st)
    with keepsake.CheckpointManager(tmp_path, model=model, optimizers=opt, timestamp=ts, staging=st,
                                    preemption_signals=()) as mgr:
        for i in range(3):
            ts.batch += 1
            mgr.save(blocking=(i == 1))
        mgr.wait()
        assert len(saves[0]) == 4 + 8  # the parameters and both AdamW moments of each
        assert saves[0] == saves[1] == saves[2]  # the same tensor at the same address each save
        assert st.allocations == 1  # the first save allocated; the next two reused it
        assert len(fake.syncs) == 3
        assert fake.live() == 1
    assert st.buffer is None and st.nbytes == 0
    assert fake.live() == 0  # close() let the buffer go
    sd = kt.load_file(tmp_path / "ep0-ba3.keepsake", verify=True)
    for k, v in model.state_dict().items():
        assert torch.equal(sd[f"state/model/{k}"], v)
    assert torch.equal(sd["state/optimizers/AdamW/state/0/exp_avg"], opt.state[model[0].weight]["exp_avg"])


@pytest.mark.parametrize("exclusive", [False, True])
def test_background_save_holds_the_pre_mutation_bytes(tmp_path, exclusive):
    fake = Fake()
    model = model_on_device(fake)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    ts = keepsake.Timestamp(batch=1)
    with keepsake.CheckpointManager(tmp_path, model=model, timestamp=ts, staging=fake.staging(exclusive),
                                    preemption_signals=()) as mgr:
        path = mgr.save(blocking=False)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(-3.0)
        ts.batch = 2
        path2 = mgr.save(blocking=False)  # the same staging, overwritten while the first may be writing
        mgr.wait()
    assert path != path2
    first, second = kt.load_file(path, verify=True), kt.load_file(path2, verify=True)
    for k, v in want.items():
        assert torch.equal(first[f"state/model/{k}"], v)
        assert torch.equal(second[f"state/model/{k}"], torch.full_like(v, -3.0))


def test_exclusive_staging_is_the_snapshot(tmp_path):
    """An exclusive staging (the manager's own kind) receives the device tensors where the
    background save's image wants them: one host copy of the state, not two. Packed tensors of
    odd sizes land unaligned, as bytes; host tensors are copied by the library into the same
    buffer; the file is the state's, and a manager's exclusive staging refuses other saves."""
    import resource
    fake = Fake()
    st = fake.staging(exclusive=True)
    big = torch.randn(2048, 4096)  # 32 MiB: 8192 pages
    odd = {"flags": torch.tensor([True, False, True]), "f64": torch.arange(5, dtype=torch.float64),
           "strided": torch.arange(20, dtype=torch.int16).reshape(4, 5).t(),
           "bf16": torch.arange(7, dtype=torch.bfloat16)}
    fake.mark(big, *odd.values())
    extra = {"host": torch.ones(3), **odd}
    ts = keepsake.Timestamp(batch=1)
    pages = big.numel() * 4 // resource.getpagesize()
    with keepsake.CheckpointManager(tmp_path / "run", extra={"big": big, **extra}, timestamp=ts, staging=st,
                                    rng=False, async_save=True, preemption_signals=()) as mgr:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        first = mgr.save(blocking=False)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        assert st.allocations == 1 and fake.syncs == ["cpu"]
        # the staging's pages fault in once; the library took no second buffer of the state's size
        assert faults < pages * 3 // 2, (faults, pages)
        big.fill_(-1.0)  # at once: the snapshot was taken
        odd["f64"].fill_(-2.0)
        ts.batch = 2
        second = mgr.save(blocking=False)  # waits for the first, which writes from the same buffer
        mgr.wait()
        assert st.allocations == 1
        with pytest.raises(RuntimeError, match="exclusive"):
            kt.save_checkpoint(tmp_path / "other.keepsake", extra={"big": big}, staging=st, rng=False)
    a, b = kt.load_file(first, verify=True), kt.load_file(second, verify=True)
    assert not torch.equal(a["state/extra/big"], b["state/extra/big"]) and torch.equal(b["state/extra/big"], big)
    assert torch.equal(a["state/extra/f64"], torch.arange(5, dtype=torch.float64))
    for k, v in extra.items():
        assert b[f"state/extra/{k}"].dtype == v.dtype and torch.equal(b[f"state/extra/{k}"], v), k
    assert st.buffer is None and fake.live() == 0  # close() let it go, after the library was done


def test_the_managers_own_staging_is_exclusive(tmp_path):
    with keepsake.CheckpointManager(tmp_path, preemption_signals=()) as mgr:
        assert mgr._staging.exclusive
    assert not kt.HostStaging().exclusive


def test_growth_and_release():
    fake = Fake()
    st = fake.staging()
    small = [torch.randn(1000) for _ in range(4)]
    fake.mark(*small)

    def save(ts):
        keep = []
        es = [st.entry(str(i), t, keep) for i, t in enumerate(ts)]
        st.stage(es)
        st.done()
        for e, t in zip(es, ts):
            off = e[3] - st.buffer.data_ptr()
            assert torch.equal(st.buffer[off:off + t.numel() * 4].view(torch.float32), t)
        return [e[3] for e in es]

    a = save(small)
    assert st.allocations == 1 and st.nbytes == _staging.GRAIN
    assert save(small) == a and st.allocations == 1
    big = torch.randn(3 * _staging.GRAIN // 8)  # 3 MiB after them: more than the buffer holds
    fake.mark(big)
    b = save(small + [big])
    need = 4 * 4032 + big.numel() * 4
    assert st.allocations == 2 and st.nbytes >= need + need // 8 and st.nbytes % _staging.GRAIN == 0
    assert fake.live() == 1  # the smaller buffer is gone
    assert save(small + [big]) == b and st.allocations == 2
    assert save(small)[:4] == b[:4] and st.allocations == 2  # less is staged in the same buffer
    st.close()
    assert st.buffer is None and fake.live() == 0
    with pytest.raises(RuntimeError):
        st.entry("x", small[0], [])
    assert st.entry("host", torch.ones(2), [])[3] != 0  # what is not a device tensor still saves


def test_a_failed_save_gives_the_staging_back(tmp_path):
    fake = Fake()
    st = fake.staging()
    model = model_on_device(fake)
    bad = torch.zeros(2, dtype=torch.complex128)
    with keepsake.CheckpointManager(tmp_path, model=model, extra={"bad": bad}, staging=st,
                                    preemption_signals=()) as mgr:
        with pytest.raises(keepsake.DTypeError):
            mgr.save()  # refused while the state is flattened: nothing was copied
        assert fake.copies == 0 and st.allocations == 0
        mgr.extra = {}
        real, calls = fake.copy, []

        def failing(dst, src):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("copy failed")
            real(dst, src)
        st._copy = failing
        with pytest.raises(RuntimeError, match="copy failed"):
            mgr.save()
        assert fake.syncs == ["cpu"]  # the copy already queued was waited for
        st._copy = fake.copy
        path = mgr.save()
        assert st.allocations == 1
    assert fake.live() == 0
    sd = kt.load_file(path)
    assert torch.equal(sd["state/model/0.weight"], model[0].weight)


def test_save_checkpoint_with_a_staging(tmp_path):
    fake = Fake()
    st = fake.staging()
    model = model_on_device(fake)
    metric = tm.SumMetric()
    metric.update(torch.tensor(4.0))
    fake.mark(metric.sum_value)
    saves = spy_staged(st)
    kt.save_checkpoint(tmp_path / "a.keepsake", model=model, train_metrics={"s": metric}, staging=st)
    kt.save_checkpoint(tmp_path / "b.keepsake", model=model, train_metrics={"s": metric}, staging=st)
    assert st.allocations == 1 and len(fake.syncs) == 2 and saves[0] == saves[1]
    assert "state/train_metrics/s/state_dict/sum_value" in dict(saves[0])
    fresh = model_on_device(Fake(), seed=5)
    m2 = tm.SumMetric()
    rep = kt.load_checkpoint(tmp_path / "b.keepsake", model=fresh, train_metrics={"s": m2})
    assert not rep.missing and not rep.mismatched
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert float(m2.compute()) == 4.0


def test_cpu_state_allocates_nothing(tmp_path):
    fake = Fake()
    st = fake.staging()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    with keepsake.CheckpointManager(tmp_path, model=model, staging=st, preemption_signals=()) as mgr:
        mgr.save(blocking=False)
        mgr.save()
    assert st.allocations == 0 and fake.copies == 0 and fake.syncs == []


def test_default_staging_is_cuda_only():
    st = kt.HostStaging()
    t = torch.ones(3)
    keep = []
    entries = [st.entry("t", t, keep)]
    assert entries == [_tensors.torch_entry("t", t, [])]
    st.stage(entries)
    st.done()
    assert st.allocations == 0 and st.buffer is None
