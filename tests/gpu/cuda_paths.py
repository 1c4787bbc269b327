#!/usr/bin/env python3
"""The package's CUDA paths, on a machine with a GPU and a CUDA build of torch.

Not run by `make test` (the development machines have no GPU). Run it with the package built
into the build tree:

    PYTHONPATH=build/python-pkg .venv/bin/python tests/gpu/cuda_paths.py [WORKDIR]

Exit status: 0 every check passed, 1 a check failed (each is printed), 77 skipped (no CUDA, or
a torch without it). What it checks:

1. pinned staging: a CUDA model, AdamW state and a metric saved by CheckpointManager with
   save(blocking=False), the CUDA tensors changed the moment save() returns, then wait(): the
   file holds the bytes of the save's moment; the staging's chunks are page-locked;
2. reuse: later saves of the same state allocate nothing and stage each tensor at the same
   address (data_ptr) as the first save;
   1 and 2 run twice: with a caller's staging, and with an exclusive one (the manager's own
   kind), whose buffer is the background save's image (device-to-host copies of packed,
   unaligned byte ranges);
3. save_checkpoint(staging=) and the default .cpu() path write the same tensors;
4. loads onto the GPU: load_checkpoint into CUDA parameters, optimizer state and metric;
   load_file(device="cuda"), safe_open(device="cuda");
5. CUDA random generators saved and restored bit for bit (save_checkpoint and the manager).
"""
import os
import sys
import tempfile
import time
import traceback

SKIP = 77


def skip(why):
    print(f"cuda_paths: SKIP: {why}")
    sys.exit(SKIP)


try:
    import torch
except ImportError:
    skip("torch is not installed")
if not torch.cuda.is_available():
    skip(f"no CUDA device (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")

import keepsake  # noqa: E402
import keepsake.torch as kt  # noqa: E402

try:
    import torchmetrics as tm
except ImportError:
    tm = None

DEV = torch.device("cuda", 0)
failures = []


def check(fn):
    """Runs one check; a failure is recorded and the others still run."""
    t0 = time.perf_counter()
    try:
        fn()
    except Exception:  # noqa: BLE001 - report every check
        failures.append(fn.__name__)
        print(f"FAIL {fn.__name__}")
        traceback.print_exc()
        return
    print(f"ok   {fn.__name__} ({time.perf_counter() - t0:.2f} s)")


def make_run(seed=0, width=1024):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 16)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metric = tm.SumMetric().to(DEV) if tm else None
    return model, opt, metric


def step(model, opt, metric):
    x = torch.randn(32, model[0].in_features, device=DEV)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if metric is not None:
        metric.update(loss.detach())


def cpu_copy(sd):
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}


def staged_entries(st):
    """Wraps st.stage to record (name, data_ptr) of every entry a save pointed into its buffer."""
    seen = []
    real, real_image = st.stage, st.stage_image

    def record(entries):
        lo = st.buffer.data_ptr() if st.buffer is not None else 0
        hi = lo + st.nbytes
        seen.extend((e[0], e[3]) for e in entries if len(e) == 5 and lo <= e[3] < hi)

    def spy(entries):
        real(entries)
        record(entries)

    def spy_image(entries, place):
        real_image(entries, place)
        record(entries)
    st.stage, st.stage_image = spy, spy_image
    return seen


def assert_file_has(path, want):
    got = kt.load_file(path, backend="read", verify=True)
    for k, v in want.items():
        assert k in got, k
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k], v), f"{k}: the file does not hold the bytes of the save's moment"


def model_keys(model, prefix="state/model/"):
    return {prefix + k: v for k, v in model.state_dict().items()}


def test_background_save_stages_through_pinned_memory(exclusive=False):
    model, opt, metric = make_run(width=2048)  # 16 MiB of weights, 48 MiB with the moments
    step(model, opt, metric)
    ts = keepsake.Timestamp(batch=1)
    st = kt.HostStaging(exclusive=exclusive)
    with tempfile.TemporaryDirectory(dir=WORK) as run:
        with keepsake.CheckpointManager(run, model=model, optimizers=opt, timestamp=ts, staging=st,
                                        train_metrics={"s": metric} if metric is not None else None,
                                        preemption_signals=()) as mgr:
            want = cpu_copy(model_keys(model))
            want["state/optimizers/AdamW/state/0/exp_avg"] = opt.state[model[0].weight]["exp_avg"].cpu().clone()
            if metric is not None:
                want["state/train_metrics/s/state_dict/sum_value"] = metric.sum_value.cpu().clone()
            t0 = time.perf_counter()
            path = mgr.save(blocking=False)
            returned = time.perf_counter() - t0
            with torch.no_grad():  # at once, on the GPU, while the write runs
                for p in model.parameters():
                    p.mul_(-1).add_(7)
                opt.state[model[0].weight]["exp_avg"].fill_(-5)
                if metric is not None:
                    metric.sum_value.fill_(1234)
            mgr.wait()
            assert st.buffer is not None and st.buffer.is_pinned(), "the staging is not page-locked"
            print(f"     save(blocking=False) returned after {returned * 1e3:.1f} ms; staging {st.nbytes >> 20} MiB")
        assert st.buffer is None, "close() kept the staging buffer"
        assert_file_has(path, want)


def test_staging_is_reused_across_saves(exclusive=False):
    model, opt, metric = make_run()
    step(model, opt, metric)
    ts = keepsake.Timestamp()
    st = kt.HostStaging(exclusive=exclusive)
    seen = staged_entries(st)
    per_save, allocs = [], []
    with tempfile.TemporaryDirectory(dir=WORK) as run:
        with keepsake.CheckpointManager(run, model=model, optimizers=opt, timestamp=ts, staging=st, keep_last=2,
                                        preemption_signals=()) as mgr:
            for i in range(4):
                ts.batch += 1
                step(model, opt, metric)
                seen.clear()
                want = cpu_copy(model_keys(model))
                path = mgr.save(blocking=(i % 2 == 0))
                mgr.wait()
                assert_file_has(path, want)
                per_save.append(list(seen))
                allocs.append(st.allocations)
    assert per_save[0], "no CUDA tensor went through the staging"
    assert all(s == per_save[0] for s in per_save), "a tensor moved to another staging address"
    assert allocs == [1] * 4, f"later saves allocated: {allocs}"


def test_save_checkpoint_paths_agree():
    model, opt, metric = make_run()
    step(model, opt, metric)
    st = kt.HostStaging()
    with tempfile.TemporaryDirectory(dir=WORK) as d:
        a, b = os.path.join(d, "a.keepsake"), os.path.join(d, "b.keepsake")
        kt.save_checkpoint(a, model=model, optimizers=opt, rng=False, staging=st)
        kt.save_checkpoint(b, model=model, optimizers=opt, rng=False)  # .cpu() per tensor, as before
        first = st.allocations
        kt.save_checkpoint(a, model=model, optimizers=opt, rng=False, staging=st)
        assert st.allocations == first
        ga, gb = kt.load_file(a, verify=True), kt.load_file(b, verify=True)
        assert ga.keys() == gb.keys()
        for k in ga:
            assert torch.equal(ga[k], gb[k]), k
    st.close()


def test_loads_onto_the_gpu():
    model, opt, metric = make_run()
    for _ in range(3):
        step(model, opt, metric)
    if metric is not None:
        metric.compute()
    saved = cpu_copy(model_keys(model))
    saved["state/optimizers/AdamW/state/0/exp_avg"] = opt.state[model[0].weight]["exp_avg"].cpu().clone()
    with tempfile.TemporaryDirectory(dir=WORK) as d:
        path = os.path.join(d, "ck.keepsake")
        kt.save_checkpoint(path, model=model, optimizers=opt, train_metrics={"s": metric} if metric else None,
                           timestamp=keepsake.Timestamp(batch=3), staging=kt.HostStaging())
        fresh, fopt, fmetric = make_run(seed=7)
        step(fresh, fopt, fmetric)  # so the optimizer has state on the GPU to replace
        rep = kt.load_checkpoint(path, model=fresh, optimizers=fopt,
                                 train_metrics={"s": fmetric} if fmetric is not None else None)
        assert not rep.missing and not rep.mismatched, str(rep)
        for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
            assert b.device.type == "cuda" and torch.equal(a, b), k
        for p, q in zip(model.parameters(), fresh.parameters()):
            for s in ("exp_avg", "exp_avg_sq"):
                assert fopt.state[q][s].device.type == "cuda" and torch.equal(opt.state[p][s], fopt.state[q][s])
        if metric is not None:
            assert fmetric.sum_value.device.type == "cuda" and torch.equal(metric.compute(), fmetric.compute())
        for m, o in ((model, opt), (fresh, fopt)):  # the resumed run goes on as the original does
            torch.manual_seed(99)
            step(m, o, None)
        for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
            assert torch.equal(a, b), f"{k} differs one step after the resume"
        got = kt.load_file(path, device="cuda")
        assert all(v.device.type == "cuda" for v in got.values())
        for k, v in saved.items():
            assert torch.equal(got[k].cpu(), v), k
        with keepsake.safe_open(path, framework="pt", device="cuda") as f:
            t = f.get_tensor("state/optimizers/AdamW/state/0/exp_avg")
            assert t.device.type == "cuda" and torch.equal(t.cpu(), saved["state/optimizers/AdamW/state/0/exp_avg"])
        assert kt.load_file(path, device=0)["state/model/0.bias"].device == DEV


def draws():
    return [torch.randn(5, device=f"cuda:{i}") for i in range(torch.cuda.device_count())] + [torch.randn(3)]


def test_cuda_rng_round_trip():
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(4321)
    draws()  # move the generators off their seeds
    with tempfile.TemporaryDirectory(dir=WORK) as d:
        path = os.path.join(d, "rng.keepsake")
        kt.save_checkpoint(path, rng=True)
        saved = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
        want = draws()
        torch.cuda.manual_seed_all(1)
        torch.manual_seed(1)
        kt.load_checkpoint(path, rng=True)
        for i, s in enumerate(saved):
            assert torch.equal(torch.cuda.get_rng_state(i), s), f"cuda:{i} generator state differs"
        got = draws()
        for a, b in zip(want, got):
            assert torch.equal(a, b), "the CUDA generator is not restored bit for bit"
        sd = kt.load_file(path)
        assert "rng/0/cuda/0" in sd
        # through the manager: autoresume restores them too
        ts = keepsake.Timestamp(batch=1)
        run = os.path.join(d, "run")
        torch.cuda.manual_seed_all(77)
        with keepsake.CheckpointManager(run, timestamp=ts, preemption_signals=()) as mgr:
            mgr.save(blocking=False)
        want = draws()
        torch.cuda.manual_seed_all(5)
        with keepsake.CheckpointManager(run, timestamp=keepsake.Timestamp(), preemption_signals=()) as mgr:
            assert mgr.autoresume()
        for a, b in zip(want, draws()):
            assert torch.equal(a, b), "autoresume did not restore the CUDA generator"


if __name__ == "__main__":
    WORK = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ks-cuda-")
    os.makedirs(WORK, exist_ok=True)
    print(f"cuda_paths: torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.get_device_name(0)}, "
          f"{torch.cuda.device_count()} device(s); work in {WORK}")
    def exclusive(fn):
        def run():
            fn(exclusive=True)
        run.__name__ = f"{fn.__name__}[exclusive]"
        return run

    for fn in (test_background_save_stages_through_pinned_memory, test_staging_is_reused_across_saves,
               exclusive(test_background_save_stages_through_pinned_memory),
               exclusive(test_staging_is_reused_across_saves),
               test_save_checkpoint_paths_agree, test_loads_onto_the_gpu, test_cuda_rng_round_trip):
        check(fn)
    print(f"cuda_paths: {len(failures)} failed" + (f": {', '.join(failures)}" if failures else ""))
    sys.exit(1 if failures else 0)
