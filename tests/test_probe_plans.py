"""Probe plans: the invariants the kernels rely on (single-cycle rings, distinct starts, distinct lines)."""
import numpy as np
import pytest

from torch_l2topo.layout import LINE_BYTES, LINE_WORDS
from torch_l2topo.measure.rings import cycle_length, line_offsets, ring_plan


@pytest.mark.parametrize("n_lines,n_sm", [(16384, 132), (4096, 108), (2, 1), (100, 200)])
def test_every_ring_is_one_cycle_through_every_line(n_lines, n_sm):
    plan = ring_plan(n_lines, n_sm, seed=3)
    assert plan.successor.shape == (LINE_WORDS, n_lines)
    for ring in plan.successor:
        assert sorted(ring.tolist()) == list(range(n_lines))  # a permutation...
        assert cycle_length(ring) == n_lines                  # ...made of a single cycle


def test_rings_differ_and_smps_sharing_a_ring_start_apart():
    plan = ring_plan(16384, 132, seed=0)
    assert len({tuple(r[:64]) for r in plan.successor}) == LINE_WORDS
    assert plan.start_ring.tolist() == [s % LINE_WORDS for s in range(132)]
    for r in range(LINE_WORDS):
        starts = plan.start_line[plan.start_ring == r]
        assert len(set(starts.tolist())) == len(starts)


def test_plan_is_reproducible_from_its_seed():
    a, b, c = ring_plan(1024, 16, seed=7), ring_plan(1024, 16, seed=7), ring_plan(1024, 16, seed=8)
    np.testing.assert_array_equal(a.successor, b.successor)
    assert not np.array_equal(a.successor, c.successor)


def test_cycle_length_detects_a_broken_ring():
    ring = np.array([1, 0, 3, 2])  # two 2-cycles
    assert cycle_length(ring) == 2


def test_line_offsets_are_distinct_consecutive_lines():
    off = line_offsets(512, first_line=3)
    assert len(set(off.tolist())) == 512
    assert off[0] == 3 * LINE_BYTES and np.all(np.diff(off) == LINE_BYTES)


@pytest.mark.parametrize("args", [(1, 4), (16, 0), (16, 4, 0, 0), (16, 4, 0, LINE_WORDS + 1)])
def test_bad_plan_parameters_are_rejected(args):
    with pytest.raises(ValueError):
        ring_plan(*args)
    with pytest.raises(ValueError):
        line_offsets(0)
