"""The geometry suite's host side without a GPU: the text summary on the recorded H200 runs (one capacity
statement per regime), the launches of the geometry kernels through the one checked launch path (a numpy
stand-in for the kernels, which checks each call against the kernel's signature), the slice-set choice, and
the driver binding's errors."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from torch_l2topo import ProbeError
from torch_l2topo import layout as L
from torch_l2topo.analysis.slices import SliceClasses
from torch_l2topo.geometry import chases, driver
from torch_l2topo.geometry.summary import capacity_lines, summary_lines
from torch_l2topo.measure import launch, probes

RECORDED = sorted((Path(__file__).resolve().parent / "data" / "geometry").glob("geometry_h200_*.json"))
MB = 1 << 20


def _recorded(path):
    return json.loads(path.read_text())["figures"]


# ---- the summary --------------------------------------------------------------------------------------------
def test_there_are_recorded_runs():
    assert len(RECORDED) >= 2, "the full suite's H200 runs (tests/data/geometry/geometry_h200_*.json) are missing"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_capacity_is_one_statement_per_regime(path):
    """The README's numbers (both H200s): one SM per partition flat to 28 MB, every SM warming: 33 MB
    effective. Not the 18 MB the one-SM curve's miss ratio gives, nor the ~61 MB mid-ramp 'knee'."""
    lines = summary_lines(_recorded(path))
    capacity = [line for line in lines if line.startswith("capacity")]
    assert len(capacity) == 2, capacity
    assert capacity[0].startswith("capacity, one SM per partition on its own ring: flat to 28 MB (")
    assert capacity[1].startswith("capacity, all SMs warming the footprint: effective capacity 33 MB (miss ratio)")
    text = "\n".join(lines)
    assert "knee" not in text and not any(f"{mb} MB" in text for mb in (18, 61, 62, 63, 64))
    for word in ("granule 64 B", "no conflict set found", "layout fixes", "persisting"):  # the rest is kept
        assert word in text, word


def test_capacity_without_a_rise_or_without_the_one_sm_run():
    footprints = [m * MB for m in (8, 16, 24, 32, 48, 64)]
    flat = {"self_warmed": {"footprint": footprints, "cycles": [[285.0, 286.0]] * 6, "cold_cycles": 670.0}}
    assert capacity_lines(flat) == ["capacity, one SM per partition on its own ring: no rise up to 64 MB "
                                    "(no rise beyond the noise and the relative step)"]
    all_sms = {"effective_capacity_bytes": None}
    assert capacity_lines(all_sms) == ["capacity, all SMs warming the footprint: effective capacity n/a (miss ratio)"]
    assert capacity_lines({}) == []


# ---- launches through probes.checked_launch, with a numpy stand-in for the kernels ------------------------
N_SM = 8


def _kernel_params(kernel: str) -> list:
    module, name = launch.KERNELS[kernel].triton.split(":")
    import importlib

    return importlib.import_module(f"torch_l2topo.triton_kernels.{module}").__dict__[name].params


def fake_geometry_launch(kernel, backend, grid, ctrl, *args):
    """The geometry kernels in numpy: every SM claimed; each measuring SM (rows[sm] = r) writes r-dependent
    results. First checks the call against the kernel's parameters, as Triton would bind them."""
    params = _kernel_params(kernel)
    keywords = launch.KERNELS[kernel].constexprs((ctrl, *args))
    positional = [p.name for p in params if p.name not in keywords]
    assert len(positional) == 1 + len(args), (kernel, positional)
    assert positional[0] == "ctrl_ptr" and positional[-3:] == ["n_sm", "wave", "timeout_ns"]
    assert backend == "triton" and grid >= N_SM
    *own, n_sm, wave, timeout_ns = args
    assert n_sm == wave == N_SM and timeout_ns == int(chases.TIMEOUT_S * 1e9)
    c = ctrl.numpy()
    c[L.CLAIMS:L.CLAIMS + n_sm] = 1
    fake_geometry_launch.calls.append((kernel, own, keywords))
    if kernel == "offsets_chase":
        base, offsets, rows, cycles, per_row, n_loads, zero = own
        offsets = offsets.numpy().reshape(-1, n_loads + 1)
        for sm, r in enumerate(rows.numpy()):
            if r >= 0:
                cycles.numpy()[r] = (base + offsets[r, :n_loads]) % 1000 + sm
                per_row.numpy()[r] = (sm, 0, 0, 0)
    elif kernel in ("lanes_chase", "ring_chase"):
        starts, rows, out, n_warm, n_timed = own
        starts = starts.numpy().reshape(out.shape[0], -1)
        for sm, r in enumerate(rows.numpy()):
            if r >= 0:
                out.numpy()[r, 0] = sm * 1000 + n_warm + n_timed
                out.numpy()[r, -1] = np.bitwise_xor.reduce(starts[r])


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(probes, "launch", fake_geometry_launch)
    monkeypatch.setattr(probes, "to_device", lambda a, device: torch.from_numpy(np.ascontiguousarray(a)))
    monkeypatch.setattr(probes, "wait_with_deadline", lambda device, deadline, what: None)
    fake_geometry_launch.calls = []
    return chases.Context(index=0, device=torch.device("cpu"), n_sm=N_SM, l2_bytes=1 << 20,
                          sm_partition=np.array([0, 1] * 4), clock_ghz=2.0, calibration=None)


def test_offsets_chase_rows_follow_the_chosen_sms(stand_in):
    offsets = np.arange(2 * 5, dtype=np.int64).reshape(2, 5) * 128
    cycles, per_row = chases.run_offsets(stand_in, 4096, offsets, [6, 3])
    assert cycles.shape == (2, 5) and cycles.dtype == np.float64
    np.testing.assert_array_equal(cycles, (4096 + offsets) % 1000 + np.array([[6], [3]]))
    assert per_row[:, 0].tolist() == [6, 3]
    _, own, _ = fake_geometry_launch.calls[0]
    padded = own[1].numpy().reshape(2, 6)
    assert (padded[:, -1] == padded[:, -2]).all()  # the read-ahead of the last load reads a copy


def test_lanes_chase_passes_its_lane_count_and_starts(stand_in):
    starts = np.arange(3 * 4, dtype=np.int64).reshape(3, 4) + 1000
    out = chases.run_lanes(stand_in, starts, [0, 5, 7], 16, 64, lanes=4)
    assert out.shape == (3, 5) and out[:, 0].tolist() == [80, 5080, 7080]
    assert out[:, 4].tolist() == np.bitwise_xor.reduce(starts, axis=1).tolist()
    assert fake_geometry_launch.calls[0][2] == {"LANES": 4}
    with pytest.raises(ValueError):
        chases.run_lanes(stand_in, starts, [0, 5], 16, 64, lanes=4)  # 3 rows of starts for 2 SMs


def test_ring_chase_and_an_unclaimed_sm(stand_in, monkeypatch):
    out = chases.run_ring(stand_in, [4096, 8192], [1, 2], 8, 32)
    assert out[:, 0].tolist() == [1040, 2040] and out[:, 2].tolist() == [4096, 8192]

    def one_sm_missing(kernel, backend, grid, ctrl, *args):
        fake_geometry_launch(kernel, backend, grid, ctrl, *args)
        ctrl.numpy()[L.CLAIMS + 3] = 0

    monkeypatch.setattr(probes, "launch", one_sm_missing)
    with pytest.raises(ProbeError, match="ring_chase probe: no CTA measured SMs 3"):
        chases.run_ring(stand_in, [4096], [1], 8, 32)


@pytest.mark.parametrize("kernel", ["chain_probe", "line_probe", "partition_probe", "partition_reprobe",
                                    "offsets_chase", "ring_chase", "lanes_chase"])
def test_checked_kernels_follow_the_claim_protocol_signature(kernel):
    """probes.checked_launches passes (ctrl, own arguments..., n_sm, wave, timeout_ns) to every kernel it
    launches; Triton-only compile-time arguments may follow as keywords."""
    params = _kernel_params(kernel)
    names = [p.name for p in params]
    end = names.index("timeout_ns") + 1
    assert names[0] == "ctrl_ptr" and names[end - 3:end] == ["n_sm", "wave", "timeout_ns"]
    assert all(p.is_constexpr for p in params[end:])


# ---- the slice-set choice -----------------------------------------------------------------------------------
def _slice_lines(labels):
    labels = np.asarray(labels)
    return chases.SliceLines(None, 1000 + 128 * np.arange(labels.size), SliceClasses(labels, 1.0, 5.0, 2.0))


def test_slice_sets_take_the_largest_class_and_one_line_of_each_class():
    sl = _slice_lines([0, 1, 1, 2, 1, 3, 1, 4, 1, 0, 5, 1])  # class 1: 6 lines; 6 classes
    one, spread = sl.sets(8)
    assert one.tolist() == [1128, 1256, 1512, 1768, 2024, 2408]  # every line of class 1 (6 < 8)
    assert spread.tolist() == [1000, 1128, 1384, 1640, 1896, 2280]  # the first line of classes 0..5
    one, spread = sl.sets(8, power_of_two=True)
    assert len(one) == len(spread) == 4 and one.tolist() == [1128, 1256, 1512, 1768]
    one, spread = _slice_lines([0, 0, 0, 0, 0, 1, 1, 2]).sets(8)
    assert len(one) == len(spread) == 3  # as many lines as there are classes


# ---- the driver binding -------------------------------------------------------------------------------------
class _FailingDriver:
    """libcuda whose calls all fail with CUresult 801 (not supported)."""

    def __getattr__(self, name):
        return lambda *args: 801


def test_driver_failures_are_probe_errors_but_cleanup_stays_quiet(monkeypatch):
    monkeypatch.setattr(driver, "libcuda", lambda: _FailingDriver())
    with pytest.raises(ProbeError, match="cuCtxSetLimit failed with CUresult 801"):
        driver.set_persisting_limit(1 << 20)
    with pytest.raises(ProbeError, match="cuCtxResetPersistingL2Cache failed"):
        driver.reset_persisting()
    assert driver.context_limit(driver.CU_LIMIT_MAX_L2_FETCH_GRANULARITY) is None
    with pytest.raises(ProbeError, match="access policy window"):  # the window is checked, the rest is not
        driver.release_persisting(0)

    def no_library():
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(driver, "libcuda", no_library)
    assert driver.context_limit(driver.CU_LIMIT_MAX_L2_FETCH_GRANULARITY) is None


@pytest.mark.parametrize("max_mb, full", [(37.5, [4, 16, 32, 48]), (30, [4, 16, 32]), (72, [4, 16, 32, 80]),
                                          (3, [16])])
def test_persisting_sizes_follow_the_devices_maximum(max_mb, full):
    """One hot size over the persisting maximum, the others under it, whatever the L2 (not the H200's 48 MB)."""
    from torch_l2topo.geometry.suite import MB, persisting_sizes

    limit = int(max_mb * MB)
    assert persisting_sizes(limit, quick=False) == [s * MB for s in full]
    sizes = persisting_sizes(limit, quick=False)
    assert sizes[-1] > limit and all(s < limit for s in sizes[:-1])
    assert persisting_sizes(limit, quick=True) == [min(8 * MB, max(MB, limit // 2 // MB * MB))]


@pytest.mark.parametrize("l2_mib,rows", [(60, 1024), (50, 1024), (40, 512), (6, 128), (2, 128)])
def test_the_layout_fixes_table_stays_within_a_third_of_the_l2(l2_mib, rows):
    """The column-read table of the layout fixes on the L2 sizes of NVIDIA's cc >= 8.0 GPUs (H200, H100, A100,
    A10): a third of the L2 at most (its reads must hit L2), the Hopper cards keeping the 1,024 rows the H200
    runs used, never fewer rows than one program step."""
    from torch_l2topo.geometry import suite

    got = suite.fix_rows(l2_mib << 20)
    table = got * (suite.FIX_COLS + L.LINE_BYTES // 16) * 16
    assert got == rows and got % suite.FIX_BLOCK_R == 0
    assert table <= (l2_mib << 20) // 3 or got == suite.FIX_BLOCK_R


def test_the_single_sm_sweep_takes_the_same_shares_of_every_l2():
    """On the 60 MiB H200 the footprints the suite was built on; on other L2 sizes the same shares of theirs, so a
    6 MiB L2 is swept around its own knee, not past it."""
    from torch_l2topo.geometry import suite

    assert suite.self_warmed_sizes(60 << 20, False) == [8, 16, 24, 28, 32, 36, 40, 48, 56, 64, 80, 96, 128]
    assert suite.self_warmed_sizes(60 << 20, True) == [16, 32, 48, 64, 96]
    for l2_mib in (6, 40, 50, 96):
        sizes = suite.self_warmed_sizes(l2_mib << 20, False)
        assert sizes == sorted(set(sizes)) and sizes[0] >= 1
        assert sizes[0] <= l2_mib / 4 + 1 and sizes[-1] >= 2 * l2_mib  # from a quarter of the L2 to twice it
