"""Decoding what the probe kernels report: error codes and claims become errors that name the SMs."""
import numpy as np
import pytest

from torch_l2topo import ProbeError
from torch_l2topo import layout as L
from torch_l2topo.measure.probes import MODES, check_control, host_deadline, wave_size


def control(n_sm, claimed, error=0, detail=0):
    c = np.zeros(L.control_words(n_sm), dtype=np.int64)
    c[L.ERROR], c[L.ERROR_DETAIL] = error, detail
    c[L.CLAIMS + np.asarray(claimed, dtype=int)] = 1
    c[L.ARRIVALS] = len(claimed)
    return c


def test_all_claimed_and_no_error_passes():
    check_control(control(8, range(8)), 8, 2.0, "chain")


def test_barrier_timeout_names_the_sms_not_reached():
    with pytest.raises(ProbeError, match=r"only 6 of 8 SMs.*not reached: 3, 5\. Other work"):
        check_control(control(8, [0, 1, 2, 4, 6, 7], L.ERR_BARRIER_TIMEOUT, 6), 8, 2.0, "chain")


def test_long_missing_lists_are_shortened():
    with pytest.raises(ProbeError, match=r"\.\.\. \(40 in all\)"):
        check_control(control(132, range(92), L.ERR_BARRIER_TIMEOUT, 92), 132, 2.0, "line")


def test_smid_out_of_range_points_at_mig():
    with pytest.raises(ProbeError, match="SM id 140.*MIG"):
        check_control(control(132, [], L.ERR_SMID_RANGE, 140), 132, 2.0, "chain")


def test_stalled_waves_and_unknown_codes():
    with pytest.raises(ProbeError, match="stalled after 17 SMs"):
        check_control(control(32, range(32), L.ERR_TURN_TIMEOUT, 17), 32, 2.0, "chain")
    with pytest.raises(ProbeError, match="unknown error code 9"):
        check_control(control(4, range(4), 9), 4, 2.0, "chain")


def test_a_silent_gap_in_the_claims_is_still_an_error():
    with pytest.raises(ProbeError, match="no CTA measured SMs 2"):
        check_control(control(4, [0, 1, 3]), 4, 2.0, "chain")


def test_wave_sizes_and_deadlines():
    assert [wave_size(m, 132) for m in ("serialized", "waves", "concurrent")] == [1, 16, 132]
    assert wave_size("waves", 8) == 8
    assert set(MODES) == {"serialized", "waves", "concurrent"}
    with pytest.raises(ValueError):
        wave_size("fast", 132)
    # serialized waits for every SM in turn: its deadline grows with the SM count, concurrent's does not
    assert host_deadline(1000, 132, 1, 2.0) > host_deadline(1000, 132, 16, 2.0) > host_deadline(1000, 132, 132, 2.0)
