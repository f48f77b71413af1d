"""Structure finders: planted structure is recovered, flat and noise maps yield none, real H200 data holds up."""
import numpy as np
import pytest

import torch_l2topo
from torch_l2topo.analysis.labels import compare_partitions, find_partitions
from torch_l2topo.analysis.nuca import fit_nuca
from torch_l2topo.analysis.slices import home_granularity, slice_classes, slice_stability
from torch_l2topo.analysis.structure import cluster_gpcs, compare_gpcs, find_twins, sm_symmetry
from torch_l2topo.labelings import adjusted_rand_index, best_match_agreement, first_seen_labels

NOISE = 0.2  # per-entry sd of the planted maps: about the H200's repeat noise (0.18 cycles)


def planted(n_gpc=8, tpcs_per_gpc=(9, 9, 8, 8, 8, 8, 8, 8), n_lines=256, n_slices=16, noise=NOISE, noise_seed=0):
    """An H200-like map: TPC t of GPC t % n_gpc (SM ids interleave GPCs, as on NVIDIA GPUs), SMs 2t and 2t+1
    twins; even GPCs near partition 0; slice of line pair l // 2 random, home = slice % 2 (the home changes
    at 256 B); latency = 280 + 30 when far + a distance per (GPC, slice) + 2.5 per TPC hop inside the GPC."""
    rng = np.random.default_rng(0)
    rounds = [(r, g) for r in range(max(tpcs_per_gpc)) for g in range(n_gpc) if r < tpcs_per_gpc[g]]
    gpc = np.repeat([g for _, g in rounds], 2)
    hop = np.repeat([r for r, _ in rounds], 2)
    slice_of_line = np.repeat(rng.permutation(np.arange(n_lines // 2) % n_slices), 2)
    side, home = gpc % 2, slice_of_line % 2
    distance = rng.uniform(0, 6, size=(n_gpc, n_slices))
    m = 280 + 30.0 * (side[:, None] != home[None, :]) + distance[gpc][:, slice_of_line] + 2.5 * hop[:, None]
    m += np.random.default_rng(noise_seed + 1).normal(0, noise, m.shape)  # a re-calibration: new noise
    addresses = (1 << 21) * 4 + 128 * np.arange(n_lines)
    return m, {"gpc": gpc, "side": side, "home": home, "slice": slice_of_line, "addresses": addresses}


@pytest.fixture(scope="module")
def plant():
    m, truth = planted()
    return fit_nuca(m, NOISE), truth


def test_planted_partitions_are_recovered(plant):
    model, truth = plant
    p = find_partitions(model)
    assert p.found and p.sm_partition[0] == 0  # partition 0 is SM 0's side
    assert best_match_agreement(p.sm_partition, truth["side"])[0] == 1.0
    assert best_match_agreement(p.line_partition, truth["home"])[0] == 1.0
    assert p.gap_cycles == pytest.approx(30, abs=1.5)
    assert p.gap_ratio == pytest.approx(p.far_cycles / p.near_cycles)
    assert np.nanmin(p.sm_margin) > p.z_critical and np.nanmin(p.line_margin) > p.z_critical
    near, far = p.near_far_values(model.matrix)
    assert near.size + far.size == model.matrix.size and near.mean() == pytest.approx(p.near_cycles)
    assert set(p.to_frames()) == {"sm", "line"}


def test_planted_twins_are_the_tpc_pairs(plant):
    model, truth = plant
    tw = find_twins(model)
    n = model.n_sm
    assert tw.count == n // 2 and tw.consecutive_fraction == 1.0
    assert np.array_equal(tw.pairs, np.arange(n).reshape(-1, 2))
    assert tw.margin > 1


def test_planted_gpcs_are_recovered_and_match_the_truth(plant):
    model, truth = plant
    g = cluster_gpcs(model)
    assert g.found and g.k == 8 and g.gap > 1
    cmp = compare_gpcs(g.labels, truth["gpc"])
    assert cmp.matched_fraction == 1.0 and cmp.purity == 1.0 and cmp.ari == pytest.approx(1.0)
    assert cluster_gpcs(model, k=2).k == 2  # an imposed k cuts there
    with pytest.raises(ValueError, match="k must be"):
        cluster_gpcs(model, k=1)


def test_planted_slices_and_granularity_are_recovered(plant):
    model, truth = plant
    sl = slice_classes(model)
    assert sl.count == 16 and adjusted_rand_index(sl.labels, truth["slice"]) == pytest.approx(1.0)
    assert sl.margin > 1
    st = slice_stability(sl, slice_classes(fit_nuca(planted(noise_seed=1)[0], NOISE)))
    assert (st.count_a, st.count_b) == (16, 16) and st.ari == pytest.approx(1.0)
    p = find_partitions(model)
    gran = home_granularity(p.line_partition, truth["addresses"])
    assert gran.block_bytes == 256 and gran.line_bytes == 128


def test_label_helpers():
    assert first_seen_labels([5, 5, 2, 7, 2]).tolist() == [0, 0, 1, 2, 1]
    assert adjusted_rand_index([0, 0, 1, 1], [3, 3, 9, 9]) == 1.0
    assert adjusted_rand_index([0, 1, 0, 1], [0, 0, 1, 1]) < 0
    assert best_match_agreement(np.array([1, 1, 0, -1]), np.array([0, 0, 1, 1])) == (1.0, {0: 1, 1: 0})
    with pytest.raises(ValueError, match="no item is labelled"):
        best_match_agreement(np.array([-1, 0]), np.array([0, -1]))


def test_compare_gpcs_scores_permutations_refinements_and_unknowns():
    truth = np.repeat(np.arange(4), 6)
    relabeled = (truth + 1) % 4
    assert compare_gpcs(relabeled, truth).matched_fraction == 1.0
    finer = np.repeat(np.arange(8), 3)  # each GPC split in two: nested, so pure, but half unmatched
    c = compare_gpcs(finer, truth)
    assert c.purity == 1.0 and c.matched_fraction == 0.5 and c.n_clusters == 8 and c.n_gpcs == 4
    wrong = relabeled.copy()
    wrong[:3] = 3
    unknown = truth.copy()
    unknown[:3] = -1  # unknown SMs are left out
    assert compare_gpcs(wrong, unknown).matched_fraction == 1.0 and compare_gpcs(wrong, unknown).n_compared == 21
    with pytest.raises(ValueError, match="integer"):
        compare_gpcs(truth.astype(float), truth)
    with pytest.raises(ValueError, match="one length"):
        compare_gpcs(truth[:5], truth)


@pytest.mark.parametrize("kind", ["flat", "noise"])
def test_flat_and_noise_maps_have_no_structure(kind):
    rng = np.random.default_rng(1)
    m = np.full((64, 128), 300.0) if kind == "flat" else 300 + rng.normal(0, NOISE, (64, 128))
    model = fit_nuca(m, NOISE)
    assert model.significant_rank == 0
    p = find_partitions(model)
    assert not p.found and "noise" in p.reason and (p.sm_partition == -1).all()
    assert not find_twins(model).found
    g = cluster_gpcs(model)
    assert not g.found and g.k == 0 and (g.labels == -1).all()
    assert slice_classes(model).count == 1 and not slice_classes(model).found
    assert not sm_symmetry(model).found


def test_sms_without_a_clear_side_stay_undecided():
    """A smooth gradient has one interaction term but no two-valued split: its middle SMs are undecided."""
    x = np.linspace(-1, 1, 64)
    y = np.sign(np.linspace(-1, 1, 128))
    m = 300 + 10 * x[:, None] * y[None, :] + np.random.default_rng(2).normal(0, NOISE, (64, 128))
    p = find_partitions(m, NOISE)
    undecided = np.flatnonzero(p.sm_partition < 0)
    assert p.found and 0 < undecided.size < 10
    assert np.abs(x[undecided]).max() < np.abs(x[p.sm_partition >= 0]).min()


def test_bad_input_is_rejected_with_a_clear_error():
    m, _ = planted(n_lines=64)
    nan = m.copy()
    nan[3, 7] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite .* SM 3, line 7"):
        find_partitions(nan, NOISE)
    with pytest.raises(ValueError, match="2-D"):
        find_twins(m[0], NOISE)
    with pytest.raises(ValueError, match="at least 2 SMs"):
        cluster_gpcs(m[:1], NOISE)
    with pytest.raises(ValueError, match="noise is required"):
        slice_classes(m)
    with pytest.raises(ValueError, match="non-negative"):
        sm_symmetry(m, -1.0)
    with pytest.raises(ValueError, match="one length"):
        home_granularity(np.zeros(4, int), np.arange(5))


def test_symmetry_finds_planted_repeated_halves():
    m, _ = planted()
    n = m.shape[0] // 2
    m[n:2 * n] = m[:n] + np.random.default_rng(3).normal(0, NOISE, m[:n].shape)  # second half repeats the first
    s = sm_symmetry(m, NOISE)
    halves = next(r for r in s.rows if r["pairing"] == "halves" and r["terms"] == "all")
    assert s.found and halves["significant"] and halves["mean_r"] > 0.9
    assert "share profiles" in s.verdict()


# ---- the bundled real H200 calibrations -----------------------------------------------------------------
@pytest.fixture(scope="module")
def real():
    return {name: fit_nuca(torch_l2topo.load_example(name)) for name in torch_l2topo.list_examples()}


def _same_gpu_pairs(real):
    names = sorted(real)
    return [(a, b) for a in names for b in names if a < b and a.split("-")[1] == b.split("-")[1]]


def test_real_partition_split_is_consistent_between_backends_and_gpus(real):
    parts = {name: find_partitions(model) for name, model in real.items()}
    for p in parts.values():
        assert p.found and sum(p.sm_counts) == 132 and sum(p.line_counts) == 512
        assert 28 < p.gap_cycles < 34  # measured 30.7-31.7 cycles
    for a, b in _same_gpu_pairs(real):
        assert compare_partitions(parts[a], parts[b]) == {"sm_agreement": 1.0, "line_agreement": 1.0}
    # Measured, Nov 2026: the two GPUs of one machine (d557bc, f78934) have the same SM split (66/66) and
    # home the same buffer offsets alike; on another machine, d00e55 splits its SMs 64/68 and agrees with
    # its neighbour 1e5731 (66/66) on only 74% of SMs: the layout differs between chips of one model.
    assert parts["h200-d557bc-cuda-waves"].sm_counts == (66, 66)
    assert compare_partitions(parts["h200-d557bc-cuda-waves"], parts["h200-f78934-cuda-waves"]) == \
        {"sm_agreement": 1.0, "line_agreement": 1.0}
    assert sorted(parts["h200-d00e55-cuda-waves"].sm_counts) == [64, 68]
    assert compare_partitions(parts["h200-1e5731-cuda-waves"], parts["h200-d00e55-cuda-waves"])["sm_agreement"] < 0.8


def test_real_tpc_twins_are_the_sm_id_pairs(real):
    for model in real.values():
        tw = find_twins(model)
        assert tw.count == 66 and tw.consecutive_fraction == 1.0


def test_real_slice_count_is_stable_between_backends(real):
    for a, b in _same_gpu_pairs(real):
        st = slice_stability(slice_classes(real[a]), slice_classes(real[b]))
        assert abs(st.count_a - st.count_b) <= 1 and st.ari > 0.99  # measured 88/88 and 88/89, ARI >= 0.999


def test_real_home_partition_changes_every_256_bytes(real):
    name = "h200-d557bc-cuda-waves"
    p = find_partitions(real[name])
    gran = home_granularity(p.line_partition, torch_l2topo.load_example(name).line_addresses)
    assert gran.block_bytes == 256


def test_real_latency_clusters_nest_inside_the_recorded_gpc_ground_truth():
    """Bundled H200 calibrations that carry thread-block-cluster ground truth (recorded with --gpc); on the
    bundled H100 they do not nest (purity 0.53: docs/results.md, H100).

    Measured, Nov 2026: 24 latency clusters of 2-3 TPCs, 93.9% of SMs in clusters inside one GPC; the rest
    are the 4 TPCs (SMs 124-131) that clusters never joined with another TPC. One-to-one match 37.9%.
    """
    names = [n for n in torch_l2topo.list_examples() if n.startswith("h200-")
             and "gpc_truth" in torch_l2topo.load_example(n).extras]
    assert len(names) >= 2
    for name in names:
        topo = torch_l2topo.load_example(name)
        truth = topo.extras["gpc_truth"]
        assert (truth >= 0).all() and (truth[0::2] == truth[1::2]).all()  # every SM placed, TPCs whole
        cmp = compare_gpcs(cluster_gpcs(topo).labels, truth)
        assert cmp.purity > 0.9 and cmp.matched_fraction < 0.5
        lone = np.flatnonzero(np.isin(truth, np.flatnonzero(np.bincount(truth) == 2)))
        assert lone.tolist() == list(range(124, 132))
