"""The columnar JSON writer of the per-CTA events: every number as json.dumps would give it back, any sign and
size, and CtaSlices.json() the same events as CtaSlices.dicts() (json.loads is the oracle)."""
import json

import numpy as np
import pytest

from torch_l2topo.profiler.trace import jsonrows
from torch_l2topo.profiler.trace.tracks import CtaSlices

EDGES = [0, 1, -1, 9, 10, -10, 999, 1000, 9999, 10000, -10000, 123456789, -5, 2**62, -(2**62), 4503599627370495]


@pytest.mark.parametrize("decimals", [0, 1, 3, 5])
def test_numbers_read_back_as_written(decimals):
    rng = np.random.default_rng(decimals)
    values = np.concatenate([EDGES, rng.integers(-10**15, 10**15, 500), rng.integers(-50, 50, 200)])
    text = jsonrows.rows(['{"v":', ',"n":', "}"], [values, np.arange(len(values))], [decimals, 0])
    back = json.loads(b"[" + text + b"]")
    expected = [v if decimals == 0 else round(v / 10**decimals, decimals) for v in values.tolist()]
    assert [e["v"] for e in back] == expected and [e["n"] for e in back] == list(range(len(values)))


def test_rows_are_checked_and_empty_is_empty():
    assert jsonrows.rows(["{", "}"], [np.zeros(0, np.int64)]) == b""
    with pytest.raises(ValueError, match="text pieces"):
        jsonrows.rows(["{"], [np.zeros(3)])
    with pytest.raises(ValueError, match="same length"):
        jsonrows.rows(["[", ",", "]"], [np.zeros(3), np.zeros(2)])


@pytest.mark.parametrize("kernel", ["row_sum_kernel", 'odd "name" 100%s\\n', "ядро"])
def test_cta_slices_json_is_their_dicts(kernel):
    rng = np.random.default_rng(7)
    n = 300
    start = rng.integers(10**12, 2 * 10**12, n)
    near = np.where(np.arange(n) % 3 == 0, -1, rng.integers(0, 5, n))  # some CTAs counted no near items
    slices = CtaSlices(1, kernel, "recorder", rng.integers(0, 132, n), np.arange(n), start,
                       start + rng.integers(-5, 10**6, n), rng.integers(1, 9, n), near, rng.integers(0, 3, n),
                       rng.integers(0, 4000, n))
    assert json.loads(b"[" + slices.json() + b"]") == slices.dicts()
    by_program = {ev["args"]["program"]: ev for ev in slices.dicts()}
    assert all(("near" in by_program[p]["args"]) == (near[p] >= 0) for p in range(n))
    assert all(by_program[p]["dur"] >= 0 for p in range(n))  # an end before its start is clamped


def _lanes_reference(sm, start, end):
    """Greedy lanes the slow way: per SM in start order, the lowest lane whose last CTA ended by this start."""
    lane = np.zeros(len(sm), np.int64)
    last_end: dict = {}
    for i in np.lexsort((start, sm)).tolist():
        ends = last_end.setdefault(int(sm[i]), [])
        k = next((j for j, e in enumerate(ends) if e <= start[i]), len(ends))
        ends[k:k + 1] = [end[i]]
        lane[i] = k
    return lane


@pytest.mark.parametrize("seed", range(6))
def test_lanes_are_the_greedy_lowest_free_lane(seed):
    from torch_l2topo.profiler.trace.tracks import lanes

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    sm = rng.integers(0, [1, 3, 132][seed % 3], n)
    start = rng.integers(0, 10**5, n)
    end = start + rng.integers(0, [10, 10**3, 10**5][seed // 2], n)
    got = lanes(sm, start, end)
    assert (got == _lanes_reference(sm, start, end)).all()
    for s in np.unique(sm):  # and no two CTAs of one lane overlap
        for k in np.unique(got[sm == s]):
            rows = np.flatnonzero((sm == s) & (got == k))
            o = rows[np.lexsort((end[rows], start[rows]))]
            assert (start[o][1:] >= end[o][:-1]).all()
