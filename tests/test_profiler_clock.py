"""The clock link on the CPU (readings with known answers), and how profile() sets up drains that hold several cycles:
each cycle's window in %globaltimer, links measured again when old, and a recorder too small for the cycles a
drain should hold (tests/test_profiler_gpu.py checks the link against real launches)."""
import warnings
from types import SimpleNamespace

import pytest

from torch_l2topo.profiler import session
from torch_l2topo.profiler.runtime import clock
from torch_l2topo.profiler.runtime.clock import RESOLUTION_NS, ClockLink, link_of


def _readings(offset: int, brackets) -> list:
    """(h0, G, h1) of kernels that read the GPU clock at host time h0 + t (t inside its bracket [0, h1 - h0])."""
    return [(h0, h0 + t + offset, h1) for h0, t, h1 in brackets]


def test_readings_intersect_to_an_interval_holding_the_true_offset():
    offset = 1_790_857_026_000_598_237
    brackets = [(1_000, 30, 1_040), (5_000, 2, 5_050), (9_000, 39, 9_040)]
    link = link_of(_readings(offset, brackets))
    assert link.lo_ns <= offset <= link.hi_ns
    # the tightest bounds: the latest read (t = h1 - h0 - 1) bounds it from below, the earliest (t = 2) from above
    assert link.lo_ns == offset - 1 - RESOLUTION_NS and link.hi_ns == offset + 2 + RESOLUTION_NS
    assert link.width_ns < min(h1 - h0 for h0, _, h1 in brackets) + 2 * RESOLUTION_NS


def test_readings_that_disagree_give_their_union():
    """A clock stepped between two readings: no offset fits both, so the link covers each."""
    a = _readings(0, [(0, 10, 20)])
    b = _readings(10_000_000, [(100, 10, 120)])
    link = link_of(a + b)
    assert link.lo_ns <= 0 and 10_000_000 <= link.hi_ns


def test_to_device_widens_by_the_drift_allowed_since_the_measurement():
    link = ClockLink(lo_ns=100, hi_ns=300, host_ns=1_000_000_000)
    assert link.to_device(1_000_000_000, 1_000_000_000) == (1_000_000_100, 1_000_000_300)
    lo, hi = link.to_device(2_000_000_000, 3_000_000_000, drift_ppm=100)
    assert lo == 2_000_000_000 + 100 - 100_000 and hi == 3_000_000_000 + 300 + 200_000


def test_windows_follow_the_cycle_and_an_old_link_is_measured_again(monkeypatch):
    measured = []
    monkeypatch.setattr(clock, "measure", lambda d, n=clock.READINGS: measured.append((d, n)) or
                        ClockLink(10, 20, 5 * session.LINK_REFRESH_NS))
    held = session.HeldCycles({0: ClockLink(0, 0, 0), 1: ClockLink(5, 6, 4 * session.LINK_REFRESH_NS + 1000)},
                               {0: 9, 1: 9})
    held.start_ns = 5 * session.LINK_REFRESH_NS
    windows = held.windows(5 * session.LINK_REFRESH_NS + 1000)
    assert measured == [(0, session.REFRESH_READINGS)]  # device 1's link is exactly LINK_REFRESH_NS old: kept
    assert windows[0] == (held.start_ns + 10, held.start_ns + 1000 + 20)
    lo, hi = windows[1]
    assert lo < held.start_ns + 5 and held.start_ns + 1000 + 6 < hi  # its drift allowance: 100 ppm of 1 s


@pytest.fixture
def block(monkeypatch):
    """profile._hold_cycles on the CPU: recorders of a given capacity, no slots, a clock link that succeeds."""
    sizes = {}

    def recorder(d, capacity=None, at_least=None):
        return SimpleNamespace(device_index=d, capacity=sizes.get(d, capacity))

    monkeypatch.setattr(session.rec, "recorder", recorder)
    monkeypatch.setattr(session, "shared_spool", lambda: SimpleNamespace(reserve=lambda *a: None))
    monkeypatch.setattr(clock, "measure", lambda d, n=clock.READINGS: ClockLink(0, 1, 0))

    def hold(devices, capacity=None, max_held=session.DEFAULT_MAX_HELD):
        prof = SimpleNamespace(_devices=devices, capacity=capacity, max_held=max_held)
        return session.profile._hold_cycles(prof)

    return sizes, hold


def test_a_drain_holds_max_held_plus_one_cycles_up_to_the_default(block):
    sizes, hold = block
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hold([0], capacity=1000).per_drain == {0: session.DEFAULT_MAX_HELD + 1}
        assert hold([0], capacity=1000, max_held=2).per_drain == {0: 3}
        assert hold([0], capacity=1000, max_held=0).per_drain == {0: 1}
        # a longer hold still drains every DEFAULT_MAX_HELD + 1 cycles: the recorder's size is bounded
        assert hold([0], capacity=1000, max_held=12).per_drain == {0: session.DEFAULT_MAX_HELD + 1}
    assert session.held_capacity(1000) == 1000 * (session.DEFAULT_MAX_HELD + 1)


def test_a_recorder_made_smaller_earlier_drains_more_often_and_says_so(block):
    sizes, hold = block
    sizes[0] = 3500  # room for 3 cycles of 1000
    with pytest.warns(UserWarning, match="hold 3 cycles, not 9"):
        held = hold([0], capacity=1000)
    assert held.per_drain == {0: 3}


def test_a_gpu_whose_clock_cannot_be_linked_drains_every_cycle(block, monkeypatch):
    _, hold = block

    def fails(d, n=clock.READINGS):
        raise RuntimeError("no triton")

    monkeypatch.setattr(clock, "measure", fails)
    with pytest.warns(UserWarning, match="drained every cycle"):
        held = hold([0], capacity=1000)
    assert held.links == {} and held.per_drain == {}  # take_all then drains it whole, one cycle a drain
