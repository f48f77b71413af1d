"""Clock alignment on synthetic launches with a known offset: the offset is found within the slack the data
allows, every CTA lands inside its own launch, CTAs from outside the trace's window stay unmatched, a clock
that drifts is followed, and a CTA that cannot fit is reported by exactly how far it sticks out."""
import numpy as np

from torch_l2topo.measure.recording import CtaRecords
from torch_l2topo.profiler.trace.align import TICK_NS, align, launch_groups
from torch_l2topo.profiler.trace.kineto import Kernels, kernel_matches

OFFSET = -1_784_721_005_612_345_678  # trace ns - globaltimer ns
GT0 = 1_790_000_000_000_000_000      # globaltimer at the first launch


def _kernels(launches, device=0):
    """Kernels from [(name, start_ns, dur_ns)] on the trace clock."""
    launches = sorted(launches, key=lambda x: x[1])
    names = np.array([n for n, _, _ in launches], dtype=object)
    start = np.array([s for _, s, _ in launches], np.int64)
    return Kernels(device, names, start, start + np.array([d for _, _, d in launches], np.int64),
                   np.zeros(len(launches), np.int64), np.arange(len(launches), dtype=np.int64))


def _records(rows, names):
    """CtaRecords from (tag, sm, program, start_gt, end_gt) rows."""
    a = np.array(rows, np.int64)
    n = len(a)
    return CtaRecords(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], np.ones(n, np.int64), np.full(n, -1), names=names)


def _launch_ctas(tag, kernel_start_trace, lead_ns, n_ctas, cta_ns, offset=OFFSET):
    """CTAs of one launch starting lead_ns after the kernel event's start, on the globaltimer clock."""
    t0 = kernel_start_trace + lead_ns - offset
    return [(tag, j % 132, j, t0 + 8 * j, t0 + 8 * j + cta_ns) for j in range(n_ctas)]


def test_launch_groups_split_where_every_cta_has_ended():
    start = np.array([0, 5, 30, 31, 100, 12])
    end = np.array([10, 20, 40, 50, 110, 25])
    groups = [sorted(g.tolist()) for g in launch_groups(start, end)]
    assert groups == [[0, 1, 5], [2, 3], [4]]


def test_kernel_names_match_triton_and_demangled_cuda_names():
    assert kernel_matches("row_sum_kernel", "row_sum_kernel")
    assert kernel_matches("void l2topo::placement_demo_kernel<true>(long*, int*)", "placement_demo_kernel")
    assert kernel_matches("void gather(float const*)", "gather")
    assert not kernel_matches("row_sum_kernel_2", "row_sum_kernel")
    assert not kernel_matches("void my_gather(float*)", "gather")


def test_offset_is_found_and_every_cta_lies_inside_its_launch():
    launches = [("k", 10_000_000 + i * 200_000, 60_000) for i in range(5)]
    rows = []
    for _, s, _ in launches:
        rows += _launch_ctas(0, s, lead_ns=3_000, n_ctas=264, cta_ns=50_000)
    al = align(_kernels(launches), _records(rows, {0: "k"}))
    summary = al.summary()
    assert summary["matched"] == len(rows) and summary["launches"] == 5
    assert summary["max_misalignment_ns"] == 0 and summary["outside"] == 0
    # the CTAs span 50 us + 263 x 8 ns = 52.1 us of a 60 us launch starting 3 us in: the data pins the offset
    # to within the slack on either side, and the fit reports that slack
    slack = (60_000 - 50_000 - 263 * 8) / 2
    assert abs(al.slack_ns - slack) <= 1
    assert abs(al.offset_ns - OFFSET) <= slack + 1
    assert al.kernel.tolist() == [i // 264 for i in range(len(rows))]


def test_ctas_from_outside_the_trace_window_stay_unmatched():
    launches = [("k", 10_000_000 + i * 200_000, 60_000) for i in range(3)]
    rows = []
    for _, s, _ in launches:
        rows += _launch_ctas(0, s, 3_000, 132, 50_000)
    early = _launch_ctas(0, 10_000_000 - 5_000_000, 3_000, 132, 50_000)  # a warmup step, never in the trace
    al = align(_kernels(launches), _records(early + rows, {0: "k"}))
    assert (al.kernel[:132] == -1).all() and (al.kernel[132:] >= 0).all()
    assert al.summary()["unmatched"] == 132 and al.summary()["max_misalignment_ns"] == 0


def test_two_kernels_interleaved_each_go_to_their_own_launches():
    launches = [("a", 1_000_000, 40_000), ("b", 1_100_000, 30_000), ("a", 1_200_000, 40_000),
                ("b", 1_300_000, 30_000)]
    rows = _launch_ctas(0, 1_000_000, 2_000, 50, 30_000) + _launch_ctas(1, 1_100_000, 2_000, 40, 20_000) + \
        _launch_ctas(0, 1_200_000, 2_000, 50, 30_000) + _launch_ctas(1, 1_300_000, 2_000, 40, 20_000)
    k = _kernels(launches)
    al = align(k, _records(rows, {0: "a", 1: "b"}))
    assert [str(k.names[i]) for i in al.kernel] == ["a"] * 50 + ["b"] * 40 + ["a"] * 50 + ["b"] * 40
    assert al.summary()["outside"] == 0


def test_a_drifting_clock_is_followed():
    # the globaltimer runs 40 ppm fast against the trace's clock over ~2 s; the launches leave 2 us of slack
    drift = 40e-6
    launches = [("k", 10_000_000 + i * 200_000_000, 20_000) for i in range(11)]
    rows = []
    for _, s, _ in launches:
        t0 = s + 1_000 - OFFSET
        t0 += int((s - launches[0][1]) * drift)  # the device clock got ahead
        rows += [(0, j, j, t0, t0 + 18_000) for j in range(100)]
    al = align(_kernels(launches), _records(rows, {0: "k"}))
    assert al.model == "drift" and abs(al.drift_ppm + 40) < 1
    assert al.summary()["outside"] == 0 and al.summary()["matched"] == len(rows)


def test_a_cta_longer_than_its_kernel_is_reported_by_its_overhang():
    launches = [("k", 5_000_000, 30_000), ("k", 5_100_000, 30_000)]
    rows = _launch_ctas(0, 5_000_000, 1_000, 20, 20_000) + _launch_ctas(0, 5_100_000, 1_000, 20, 20_000)
    rows[5] = (0, 5, 5, rows[5][3], rows[5][3] + 29_100 + 3_000)  # starts 1 us in, runs 3.1 us past the end
    al = align(_kernels(launches), _records(rows, {0: "k"}))
    s = al.summary()
    assert s["matched"] == len(rows) and s["outside"] >= 1
    # no offset can hide 2 us of overhang: the fit balances it between the two launches' margins and the CTA
    # still sticks out by at least the part no shift can absorb
    assert al.misalignment_ns[5] >= TICK_NS and s["max_misalignment_ns"] == al.misalignment_ns.max()
    assert s["slack_ns"] < 0


def test_nothing_to_align():
    empty = _records([(0, 0, 0, 0, 1)], {0: "k"}).select(np.zeros(1, bool))
    assert align(_kernels([("k", 0, 10)]), empty).model == "none"
    lone = _records(_launch_ctas(0, 1000, 10, 3, 100), {0: "k"})
    assert align(_kernels([("other", 1000, 1000)]), lone).summary()["matched"] == 0
