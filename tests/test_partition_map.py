"""Partition maps of tensors (torch_l2topo/partition_map.py): the decision on synthetic and real H200 data,
the SM pairs and the probe plan, the per-allocation cache on CPU tensors, and the map itself on a GPU."""
import gc

import numpy as np
import pytest
import torch

from torch_l2topo import load_example, sm_labels
from torch_l2topo import partition_map as pm


@pytest.fixture(scope="module")
def h200():
    topo = load_example("h200")
    return topo, sm_labels(topo)


@pytest.fixture(autouse=True)
def empty_cache():
    pm.clear_cache()
    yield
    pm.clear_cache()


# ---- the decision on synthetic data -------------------------------------------------------------------
def _synthetic(n_blocks=4096, per_block=1, offset=12.0, noise=1.0, seed=0):
    """8 SMs (4 per partition, each with its own near/far), blocks with random homes in contiguous ranges,
    each timed by one SM (per_block=1) or by the pair of SMs 2i, 2i+1 (opposite partitions); the timings sit
    `offset` cycles above the calibration (the kernel's per-load overhead differs from the line probe's)."""
    rng = np.random.default_rng(seed)
    part = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    near = 280.0 + np.arange(8)
    far = near + 30.0
    home = rng.integers(0, 2, n_blocks)
    if per_block == 1:
        sms = ((np.arange(n_blocks) * 8) // n_blocks)[:, None]
    else:
        pair = (np.arange(n_blocks) * 4) // n_blocks
        sms = np.stack([2 * pair, 2 * pair + 1], axis=1)
    mean = np.where(part[sms] == home[:, None], near[sms], far[sms]) + offset
    cycles = mean + rng.normal(0, noise, mean.shape)
    return cycles, sms, part, near, far, home


@pytest.mark.parametrize("per_block", [1, 2])
def test_classify_finds_known_homes(per_block):
    cycles, sms, part, near, far, home = _synthetic(per_block=per_block)
    got = pm.classify_blocks(cycles, sms, part, near, far)
    assert got.found, got.reason
    decided = got.homes >= 0
    assert decided.mean() > 0.99
    assert np.array_equal(got.homes[decided], home[decided])
    # each SM's threshold came from the timings: its midpoint plus the overhead the calibration lacks
    np.testing.assert_allclose(got.threshold, (near + far) / 2 + 12.0, atol=1.0)


def test_classify_marks_blocks_within_noise_undecided():
    cycles, sms, part, near, far, _ = _synthetic(per_block=2)
    threshold = (near + far) / 2 + 12.0
    cycles[:10] = threshold[sms[:10]] + 0.5  # both timings a hair above their SM's threshold: no evidence
    got = pm.classify_blocks(cycles, sms, part, near, far)
    assert (got.homes[:10] == -1).all()
    assert (got.margin[:10] < pm.UNDECIDED_Z * pm.NOISE_CYCLES * np.sqrt(2)).all()


def test_classify_ignores_missing_timings_and_sms_without_partition():
    cycles, sms, part, near, far, home = _synthetic(per_block=2)
    cycles[:5, 0] = np.nan
    part = part.copy()
    part[1] = -1
    got = pm.classify_blocks(cycles, sms, part, near, far)
    assert got.found and np.isnan(got.threshold[1])
    decided = got.homes >= 0
    assert np.array_equal(got.homes[decided], home[decided]) and decided.mean() > 0.95


def test_flat_map_is_no_structure():
    """Negative fixture: timings with no partition in them leave every block undecided, with a reason."""
    rng = np.random.default_rng(1)
    _, sms, part, near, far, _ = _synthetic(per_block=2)
    flat = pm.classify_blocks(300 + rng.normal(0, 1, sms.shape), sms, part, near, far)
    assert not flat.found and "no structure" in flat.reason and (flat.homes == -1).all()
    # spread as wide as the partitions' gap, but unrelated to any home: the SMs of a pair disagree
    wide = pm.classify_blocks(300 + rng.uniform(-40, 40, sms.shape), sms, part, near, far)
    assert not wide.found and "no structure" in wide.reason and (wide.homes == -1).all()


def test_classify_checks_its_inputs():
    cycles, sms, part, near, far, _ = _synthetic()
    with pytest.raises(ValueError, match="one shape"):
        pm.classify_blocks(cycles, sms[:-1], part, near, far)
    with pytest.raises(ValueError, match="SM ids"):
        pm.classify_blocks(cycles, sms + 8, part, near, far)
    with pytest.raises(ValueError, match="near and far"):
        pm.classify_blocks(cycles, sms, part, near[:-1], far)


# ---- the decision on real H200 data -------------------------------------------------------------------
def _first_lines(topo, labels):
    """Each 256-byte block of the calibration's 512 lines: (SM x block latency of its first line, home)."""
    return topo.line_cycles[:, 0::2].astype(np.float64), labels.line_partition[0::2]


def test_real_h200_blocks_timed_by_sm_pairs_are_all_read_right(h200):
    """Pairs chosen on one half of the calibration's blocks read every block of the other half right, far
    from the threshold, whichever pair times it."""
    topo, labels = h200
    first, truth = _first_lines(topo, labels)
    n = first.shape[1]
    for train, test in ((np.arange(n // 2, n), np.arange(n // 2)), (np.arange(n // 2), np.arange(n // 2, n))):
        seen = np.full(topo.n_lines, -1)
        seen[2 * train], seen[2 * train + 1] = truth[train], truth[train]
        pairs = pm.choose_pairs(topo.line_cycles, labels.partition, seen)
        assert len(pairs.sms) == 66 and (labels.partition[pairs.sms] == [0, 1]).all()
        for a, b in pairs.sms:
            sms = np.tile([a, b], (len(test), 1))
            got = pm.classify_blocks(first[sms, test[:, None]], sms, labels.partition, labels.near_cycles,
                                     labels.far_cycles)
            assert got.found and np.array_equal(got.homes, truth[test]), (a, b)
            assert got.margin.min() > 3 * pm.UNDECIDED_Z * pm.NOISE_CYCLES


def test_real_h200_one_sm_per_block_misreads_some_blocks(h200):
    """Why the map times each block with two SMs: one SM's latency alone (the SM's own threshold) misreads
    a few percent of the blocks, since latency also grows with the distance to the line's L2 slice."""
    topo, labels = h200
    first, truth = _first_lines(topo, labels)
    agree = []
    for sm in range(topo.n_sm):
        got = pm.classify_blocks(first[sm], np.full(first.shape[1], sm), labels.partition, labels.near_cycles,
                                 labels.far_cycles)
        agree.append(np.mean(got.homes == truth))
    assert 0.85 < np.mean(agree) < 0.99


def test_probe_plan_times_every_block_once_per_partition(h200):
    topo, labels = h200
    pairs = pm.choose_pairs(topo.line_cycles, labels.partition, labels.line_partition)
    for n_blocks in (1, 65, 131072):
        plan = pm.probe_plan(n_blocks, pairs.sms, topo.n_sm)
        timers = pm.timers_of_blocks(plan, n_blocks)
        assert (timers >= 0).all()
        assert (labels.partition[timers] == [0, 1]).all()  # row p is timed by an SM of partition p
        sizes = plan[:, 1] - plan[:, 0]
        assert sizes.sum() == 2 * n_blocks and sizes.max() - sizes[sizes > 0].min() <= 1
    assert pairs.best[0] in np.flatnonzero(labels.partition == 0)
    assert pairs.best[1] in np.flatnonzero(labels.partition == 1)


def test_block_count_covers_the_storage():
    assert pm.n_blocks_of(32 << 20, 256) == 131072
    assert pm.n_blocks_of(256 + 8, 256) == 2      # the probe's 8-byte word of the last block fits
    assert pm.n_blocks_of(256 + 7, 256) == 1      # ... here it would not


# ---- the cache, on CPU tensors -----------------------------------------------------------------------
def test_untyped_storage_is_one_python_object():
    """The cache relies on it: a weakref.finalize on the storage object runs when the last tensor on it goes."""
    t = torch.zeros(64)
    assert t.untyped_storage() is t.untyped_storage() is t[3:].view(-1).untyped_storage()
    fired = []
    import weakref

    weakref.finalize(t.untyped_storage(), fired.append, True)
    view = t[1:]
    del t
    gc.collect()
    assert not fired  # the view keeps the storage (and its Python object) alive
    del view
    gc.collect()
    assert fired


def _fake_map(tensor):
    s = tensor.untyped_storage()
    return pm.PartitionMap(homes=np.zeros(1, np.int8), margin=np.zeros(1, np.float32), block_bytes=256,
                           data_ptr=s.data_ptr(), nbytes=s.nbytes(), device_index=0, elapsed_s=0.0, probe_s=0.0)


def test_cache_serves_every_view_of_one_storage():
    t = torch.zeros(1024)
    m = _fake_map(t)
    pm._remember(t, 256, m)
    assert pm._cached(t, 256) is m
    assert pm._cached(t[::2], 256) is m and pm._cached(t.view(32, 32).T, 256) is m  # the whole storage
    assert pm._cached(t, 512) is None          # another block size is another map
    assert pm._cached(torch.zeros(1024), 256) is None


def test_cache_entry_goes_with_its_storage():
    t = torch.zeros(1024)
    pm._remember(t, 256, _fake_map(t))
    assert len(pm._MAPS) == 1
    del t
    gc.collect()
    assert not pm._MAPS


def test_cache_misses_a_resized_storage_and_keeps_one_entry_per_storage():
    t = torch.zeros(1024)
    pm._remember(t, 256, _fake_map(t))
    t.untyped_storage().resize_(8192)
    assert pm._cached(t, 256) is None
    pm._remember(t, 256, _fake_map(t))
    assert len(pm._MAPS) == 1


def test_cache_rejects_another_storage_at_a_recycled_address():
    t = torch.zeros(1024)
    pm._remember(t, 256, _fake_map(t))
    other = torch.zeros(1024)
    key = pm._key(other.untyped_storage(), other.device, 256)
    pm._MAPS[key] = pm._MAPS.pop(pm._key(t.untyped_storage(), t.device, 256))  # as if `other` reused the address
    assert pm._cached(other, 256) is None


def test_clear_cache_forgets_maps_and_detaches_finalizers():
    t = torch.zeros(1024)
    pm._remember(t, 256, _fake_map(t))
    pm.clear_cache()
    assert not pm._MAPS
    pm._remember(t, 256, _fake_map(t))
    pm.clear_cache()
    del t
    gc.collect()
    assert not pm._MAPS


def test_partition_map_flow_on_a_stand_in_gpu(h200, monkeypatch):
    """partition_map's host path end to end, the probe replaced by the bundled calibration: block j of the
    tensor behaves like the calibration's block j % 256, as each pair's SMs saw it, plus a per-load overhead."""
    import contextlib

    import torch_l2topo.calibration as cal

    topo, labels = h200
    first, truth = _first_lines(topo, labels)
    pairs = pm.choose_pairs(topo.line_cycles, labels.partition, labels.line_partition)
    setup = pm._Setup(topo, topo.n_sm, labels.partition, labels.near_cycles, labels.far_cycles, pairs)
    rng = np.random.default_rng(0)

    def fake_probe(tensor, plan, n_sm, *, block_bytes, backend, timeout_s):
        n = pm.n_blocks_of(tensor.untyped_storage().nbytes(), block_bytes)
        sms = pm.timers_of_blocks(plan, n).T
        cycles = first[sms, np.arange(n) % first.shape[1]] + 9.0 + rng.normal(0, 0.3, sms.shape)
        return cycles.astype(np.float32), 1e-3

    monkeypatch.setattr(pm, "_storage_of", lambda tensor, block_bytes: tensor.untyped_storage())
    monkeypatch.setattr(pm, "_setup", lambda index, topology, backend: setup)
    monkeypatch.setattr(pm, "run_probe", fake_probe)
    monkeypatch.setattr(cal, "measuring", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    t = torch.zeros((1 << 20) // 4)
    m = pm.partition_map(t)
    assert m.n_blocks == 4096 and m.homes.dtype == np.int8 and m.probe_s == 1e-3 and m.elapsed_s > 0
    assert np.array_equal(m.homes, np.tile(truth, 16))
    assert pm.partition_map(t[7:]) is m


def test_partition_map_refuses_cpu_and_empty_tensors():
    with pytest.raises(ValueError, match="CUDA"):
        pm.partition_map(torch.zeros(16))
    with pytest.raises(TypeError):
        pm.partition_map(np.zeros(16))


@pytest.mark.gpu
def test_partition_map_refuses_empty_tensors_and_odd_blocks():
    with pytest.raises(ValueError, match="empty"):
        pm.partition_map(torch.empty(0, device="cuda"))
    with pytest.raises(ValueError, match="block_bytes"):
        pm.partition_map(torch.zeros(64, device="cuda"), block_bytes=200)


# ---- on the GPU -----------------------------------------------------------------------------------------
MB32 = 32 << 20


@pytest.mark.gpu
def test_partition_map_of_32mb_agrees_with_the_serialized_reprobe():
    t = torch.randn(MB32 // 4, device="cuda")
    m = pm.partition_map(t)
    assert m.n_blocks == MB32 // 256 and m.homes.dtype == np.int8
    assert m.elapsed_s > 0 and 0 < m.probe_s <= m.elapsed_s
    assert m.undecided_fraction < 0.01
    assert 0.3 < np.mean(m.homes == 0) < 0.7  # homes alternate with the address hash: both partitions
    sample = np.random.default_rng(0).choice(m.n_blocks, 4096, replace=False)
    check = pm.reprobe(t, sample)
    assert np.isin(check.homes, (0, 1)).all()
    # the check's SMs see L2 hits: between an L1 hit (tens of cycles) and DRAM (600+)
    assert 200 < np.median(check.cycles) < 450
    assert pm.agreement(m, check) >= 0.999, (pm.agreement(m, check), m.undecided_fraction)


@pytest.mark.gpu
def test_partition_map_timings_are_l2_hits():
    from torch_l2topo.partition_map import _setup

    from torch_l2topo.calibration import measuring

    t = torch.randn(MB32 // 4, device="cuda")
    setup = _setup(t.device.index, None, "triton")
    n_blocks = pm.n_blocks_of(MB32, 256)
    with measuring(t.device.index):
        cycles, _ = pm.run_probe(t, pm.probe_plan(n_blocks, setup.pairs.sms, setup.n_sm), setup.n_sm)
    assert not np.isnan(cycles).any()
    assert 200 < np.median(cycles) < 450


@pytest.mark.gpu
def test_partition_map_is_cached_until_the_storage_is_freed():
    t = torch.randn(MB32 // 4, device="cuda")
    first = pm.partition_map(t)
    assert pm.partition_map(t) is first
    assert pm.partition_map(t[1:].view(-1)[::3]) is first  # a view maps (and caches) the whole storage
    key = pm._key(t.untyped_storage(), t.device, 256)
    del t
    gc.collect()
    assert key not in pm._MAPS
    again = torch.randn(MB32 // 4, device="cuda")  # likely the same address, maybe other physical pages
    second = pm.partition_map(again)
    assert second is not first and second.elapsed_s > 0
