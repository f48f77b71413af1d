"""The probes' host side on CPU: buffers built from a plan, launches checked and decoded, with a numpy
stand-in for the kernels that chases the very pointers the host wrote (so the ring layout is checked too)."""
import numpy as np
import pytest
import torch

from torch_l2topo import ProbeError
from torch_l2topo import layout as L
from torch_l2topo.measure import probes
from torch_l2topo.measure.rings import ring_plan

N_SM = 8
CYCLES_PER_LOAD, NS_PER_LOAD = 280, 140


def _words(t: torch.Tensor) -> np.ndarray:
    return t.numpy()


def _chase(buf: torch.Tensor, addr: int, n: int) -> int:
    words, base = _words(buf), buf.data_ptr()
    for _ in range(n):
        addr = int(words[(addr - base) // 8])
    return addr


def fake_launch(kernel, backend, grid, ctrl, *args):
    """What the kernels write: claims, then per-SM results, chasing the host-built buffers. The arguments are
    those of the real kernels (launch.py), in their order."""
    *kernel_args, n_sm, wave, timeout_ns = args
    assert grid >= n_sm and 1 <= wave <= n_sm and timeout_ns > 0
    fake_launch.waves.append(wave)
    c = _words(ctrl)
    c[L.CLAIMS:L.CLAIMS + n_sm] = 1
    c[L.ARRIVALS] = c[L.TURN] = n_sm
    if kernel == "chain_probe":
        starts, out, n_loads, n_warm_first, n_first, n_warm = kernel_args
        fake_launch.warm.append((n_warm_first, n_first, n_warm))
        ring = fake_launch.ring
        out = _words(out).reshape(n_sm, L.OUT_WORDS)
        for sm, start in enumerate(_words(starts)):
            begin = _chase(ring, int(start), n_warm_first if sm < n_first else n_warm)
            end = _chase(ring, begin, n_loads)
            out[sm] = (CYCLES_PER_LOAD * n_loads + sm, NS_PER_LOAD * n_loads, end - begin, 1000 * sm)
    else:
        assert kernel == "line_probe"
        lines, cycles, per_sm, n_lines, n_warm, n_timed = kernel_args
        cycles = _words(cycles).reshape(n_sm, n_lines)
        per_sm = _words(per_sm).reshape(n_sm, L.OUT_WORDS)
        base = lines.data_ptr()
        for sm in range(n_sm):
            broken = 0
            for line in range(n_lines):
                home = base + line * L.LINE_BYTES
                broken += _chase(lines, home, n_warm + n_timed) != home
                cycles[sm, line] = (CYCLES_PER_LOAD + line % 2) * n_timed
            per_sm[sm] = (2 * n_lines, n_lines, broken, 1000 * sm)


@pytest.fixture
def cpu_probes(monkeypatch):
    monkeypatch.setattr(probes, "to_device", lambda a, device: torch.from_numpy(np.ascontiguousarray(a)))
    monkeypatch.setattr(probes, "wait_with_deadline", lambda device, deadline, what: None)
    monkeypatch.setattr(probes, "launch", fake_launch)
    fake_launch.waves, fake_launch.warm = [], []
    real_zeros = torch.zeros

    def zeros(*args, **kw):  # remember the chain buffer: the fake kernel chases it
        t = real_zeros(*args, **{k: v for k, v in kw.items() if k != "device"})
        if t.numel() == fake_launch.expect_ring:
            fake_launch.ring = t
        return t

    monkeypatch.setattr(torch, "zeros", zeros)
    return probes


@pytest.mark.parametrize("mode, wave", [("waves", L.LINE_WORDS), ("serialized", 1), ("concurrent", 40)])
def test_chain_buffers_chase_back_to_every_start(cpu_probes, mode, wave):
    n_sm = 40  # more SMs than rings: SMs share rings and must start apart
    plan = ring_plan(64, n_sm, seed=2)
    fake_launch.expect_ring = plan.n_lines * L.LINE_WORDS
    results = cpu_probes.run_chain("cpu", n_sm, plan, "triton", mode, 2.0, repeats=2, settle=7)
    assert fake_launch.waves == [wave, wave]  # the mode reached the kernel as its wave size
    # whole warm passes for one SM of every ring (or the whole first wave), in the first launch only; every
    # other SM, and later repeats, settle with 7 loads
    first = max(wave, L.LINE_WORDS)
    assert fake_launch.warm == [(64, first, 7), (7, first, 7)]
    np.testing.assert_array_equal(results[1].start_ns, 1000 * np.arange(n_sm))
    assert len(results) == 2
    np.testing.assert_allclose(results[0].cycles, CYCLES_PER_LOAD + np.arange(n_sm) / 64)
    np.testing.assert_allclose(results[0].clock_ghz, results[0].cycles / NS_PER_LOAD)


def test_a_corrupted_ring_is_reported(cpu_probes, monkeypatch):
    plan = ring_plan(64, N_SM, seed=2)
    broken = plan.successor.copy()
    broken[0, [0, 1]] = broken[0, [1, 0]]  # ring 0 is no longer one cycle
    fake_launch.expect_ring = plan.n_lines * L.LINE_WORDS
    with pytest.raises(ProbeError, match="did not return to its start on SMs 0"):
        cpu_probes.run_chain("cpu", N_SM, type(plan)(broken, plan.start_ring, plan.start_line), "cuda", "waves",
                             2.0)


def test_line_buffer_points_to_itself_and_results_decode(cpu_probes):
    fake_launch.expect_ring = -1
    buf = cpu_probes.line_buffer(16, "cpu")
    (r,) = cpu_probes.run_lines("cpu", N_SM, 16, 2, 8, "triton", "waves", 2.0, lines=buf)
    assert r.cycles.shape == (N_SM, 16) and (r.cycles[:, 1] == CYCLES_PER_LOAD + 1).all()
    np.testing.assert_array_equal(r.line_addresses, buf.data_ptr() + np.arange(16) * L.LINE_BYTES)
    np.testing.assert_allclose(r.sm_clock_ghz, 2.0)
    with pytest.raises(ValueError, match="holds 16 lines, not 32"):
        cpu_probes.run_lines("cpu", N_SM, 32, 2, 8, "triton", "waves", 2.0, lines=buf)
    _words(buf)[L.LINE_WORDS * 3] += L.LINE_BYTES  # line 3 now points at line 4
    with pytest.raises(ProbeError, match="self-pointing line returned another address"):
        cpu_probes.run_lines("cpu", N_SM, 16, 2, 8, "cuda", "waves", 2.0, lines=buf)


def test_bad_backend_and_mode(cpu_probes):
    with pytest.raises(ValueError, match="backend"):
        cpu_probes.run_lines("cpu", N_SM, 16, 2, 8, "opencl", "waves", 2.0)
    with pytest.raises(ValueError, match="mode"):
        cpu_probes.run_chain("cpu", N_SM, ring_plan(8, N_SM), "cuda", "fast", 2.0)
