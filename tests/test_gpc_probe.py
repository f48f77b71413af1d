"""GPC ground truth from cluster records: union-find on planted GPCs (CPU)."""
import numpy as np
import pytest

from torch_l2topo.measure.gpc_probe import union_clusters


def planted_records(gpc_of_sm, sizes=(2, 4, 8), launches=30, seed=0):
    """Clusters drawn like the hardware does: every cluster inside one GPC, on distinct SMs."""
    rng = np.random.default_rng(seed)
    gpcs = [np.flatnonzero(gpc_of_sm == g) for g in np.unique(gpc_of_sm)]
    records = []
    for _ in range(launches):
        for size in sizes:
            ctas = []
            for members in gpcs:
                for _ in range(len(members) // size):
                    ctas.extend(rng.choice(members, size, replace=False))
            records.append((np.array(ctas), size))
    return records


def test_planted_gpcs_are_recovered_exactly():
    gpc = np.repeat(np.arange(8), [16, 16, 18, 18, 16, 16, 16, 16])
    labels = union_clusters(len(gpc), planted_records(gpc))
    # same partition, whatever the label names
    assert len(set(zip(labels.tolist(), gpc.tolist()))) == 8 == len(set(labels.tolist()))


def test_sms_never_seen_are_unlabelled_and_singletons_stay_apart():
    labels = union_clusters(6, [(np.array([0, 1, 2, 3]), 2)])
    assert labels.tolist() == [0, 0, 1, 1, -1, -1]


def test_no_records_means_no_structure():
    assert (union_clusters(4, []) == -1).all()


@pytest.mark.parametrize("records", [[(np.array([0, 1, 2]), 2)], [(np.array([0, 9]), 2)]])
def test_bad_records_are_rejected(records):
    with pytest.raises(ValueError):
        union_clusters(4, records)
