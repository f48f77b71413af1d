"""Instrumented twins on a GPU: a @triton.jit kernel's twin writes one record per program (each program id once,
on an SM of the device, start before end) and computes what the original computes; swapped out, the original
runs and writes nothing; profile(kernels="triton") gives a torch.compile'd function's Inductor kernels CTA tracks,
every CTA inside its own kernel event, with the function's output unchanged."""
import contextlib

import numpy as np
import pytest
import torch

import torch_l2topo
from torch_l2topo.measure import recording
from torch_l2topo.profiler import session
from torch_l2topo.profiler.kernels.twins import Twins, loaded_kernels
from torch_l2topo.profiler.trace.align import TICK_NS
from torch_l2topo.profiler.trace.readback import launches
from torch_l2topo.profiler.trace.tracefile import load_trace
from torch_l2topo.profiler.trace.tracks import CTA_CATEGORY

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
pytestmark = pytest.mark.gpu
N, BLOCK = 1 << 20, 1024


@triton.jit
def _twice(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0, mask=m)


@pytest.fixture(scope="module", autouse=True)
def held_recorder():
    """GPU 0's recorder made as test_profiler_gpu.py makes it, whichever module runs first."""
    recording.recorder(0, session.held_capacity())


def _n_sm():
    return torch.cuda.get_device_properties(0).multi_processor_count


def test_a_twin_records_every_program_once_and_computes_the_same():
    x = torch.randn(N, device="cuda")
    grid = (triton.cdiv(N, BLOCK),)
    plain = torch.empty_like(x)
    _twice[grid](x, plain, N, BLOCK=BLOCK)  # loads the original
    rec = recording.recorder(0)
    torch.cuda.synchronize()
    rec.drain()
    twins = Twins()
    kernels = [k for k in loaded_kernels() if k.name == "_twice"]
    assert len(kernels) == 1
    original = kernels[0].handle()
    result = twins.swap_in({0: rec})
    assert "_twice" in result["instrumented"], result["plain"].get("_twice")
    assert kernels[0].handle() != original
    twin_out = torch.empty_like(x)
    _twice[grid](x, twin_out, N, BLOCK=BLOCK)
    twins.swap_out()
    assert kernels[0].handle() == original
    _twice[grid](x, plain, N, BLOCK=BLOCK)  # the original again: no record
    records = rec.drain().of_kernel("_twice")
    torch.testing.assert_close(twin_out, x * 2.0, rtol=0, atol=0)
    torch.testing.assert_close(plain, twin_out, rtol=0, atol=0)
    assert sorted(records.program.tolist()) == list(range(grid[0]))
    assert ((records.sm >= 0) & (records.sm < _n_sm())).all()
    assert (records.end_ns >= records.start_ns).all() and (records.items == 1).all() and (records.near == -1).all()


def _pointwise_and_reduction(a, b):
    return torch.relu(a * b + 1.0).sum(dim=-1)


def test_profile_triton_gives_a_compiled_functions_kernels_cta_tracks(tmp_path):
    f = torch.compile(_pointwise_and_reduction)
    a, b = torch.randn(4096, 1024, device="cuda"), torch.randn(4096, 1024, device="cuda")
    expected = _pointwise_and_reduction(a, b)
    f(a, b)  # compiled before the block, as a model usually is
    before = {id(k.sites[0][0]): k.handle() for k in loaded_kernels()}
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=acts, kernels="triton") as prof:
        for _ in range(3):
            out = f(a, b)
            prof.step()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-3)
    covered = prof.handler.triton_kernels
    assert covered and any(name.startswith("triton_") for name in covered["instrumented"]), covered
    trace = load_trace(prof.written[0])
    ls = [launch for launch in launches(trace) if launch["kernel"] in covered["instrumented"]]
    assert len(ls) >= 2  # each instrumented kernel ran in both active steps
    events = trace["traceEvents"]
    for launch in ls:
        ctas = [ev for ev in events if ev.get("cat") == CTA_CATEGORY and ev["args"]["launch"] == launch["launch"]]
        programs = sorted(ev["args"]["program"] for ev in ctas)
        assert programs == list(range(len(programs))) and programs
        kernel = events[launch["launch"]]
        grid = kernel["args"].get("grid", [len(programs), 1, 1])
        assert len(programs) == int(np.prod(grid))
        for ev in ctas:
            assert kernel["ts"] - TICK_NS / 1000 <= ev["ts"]
            assert ev["ts"] + ev["dur"] <= kernel["ts"] + kernel["dur"] + TICK_NS / 1000
    # after the block every kernel launches its original again
    assert before and all(k.handle() == before[id(k.sites[0][0])] for k in loaded_kernels()
                          if id(k.sites[0][0]) in before)
    torch.testing.assert_close(f(a, b), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fault", ["no-ptxas", "scan-raises"])
def test_twins_that_cannot_be_made_leave_the_kernels_plain_and_the_traces_written(tmp_path, monkeypatch, fault):
    from torch_l2topo.profiler.kernels import twins as twins_module

    x = torch.randn(N, device="cuda")
    grid = (triton.cdiv(N, BLOCK),)
    out = torch.empty_like(x)
    _twice[grid](x, out, N, BLOCK=BLOCK)
    fresh = Twins()  # no twin built earlier in the process
    monkeypatch.setattr(twins_module, "_twins", fresh)
    if fault == "no-ptxas":
        monkeypatch.setattr(twins_module, "_ptxas_candidates", lambda: [])
    else:
        def broken():
            raise RuntimeError("injected")

        monkeypatch.setattr(twins_module, "loaded_kernels", broken)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with pytest.warns(UserWarning) if fault == "scan-raises" else contextlib.nullcontext():
        with torch_l2topo.profile(tmp_path, schedule=sched, activities=acts, kernels="triton") as prof:
            for _ in range(2):
                _twice[grid](x, out, N, BLOCK=BLOCK)
                prof.step()
    torch.testing.assert_close(out, x * 2.0, rtol=0, atol=0)
    assert len(prof.written) == 1 and load_trace(prof.written[0])["traceEvents"]
    if fault == "no-ptxas":
        assert "did not assemble" in prof.handler.triton_kernels["plain"]["_twice"]
    assert not any(launch["kernel"] == "_twice" for launch in launches(load_trace(prof.written[0])))
