"""What "auto" tries and how it decides, without a GPU: candidates from the kernel's occupancy and the items,
the pruning and trial budget, the rule that nothing slower than a plain launch is chosen (on recorded-style
timings), the decision in words; and the occupancy arithmetic against the CUDA occupancy calculator."""
import pytest

from torch_l2topo.placement.choice import (
    MAX_TRIAL_LAUNCHES,
    Candidate,
    Decision,
    candidates,
    choose,
    claim_chunk,
    host_extra,
    persistent_ctas,
    trial_rounds,
    trial_schedule,
)
from torch_l2topo.placement.occupancy import SmLimits, resident_ctas
from torch_l2topo.placement.plans import POLICIES

PLAIN = Candidate("plain")
QUEUES = Candidate("partition_queues")
H100_SM = SmLimits(threads=2048, registers=65536, shared_bytes=233472, ctas=32)  # cc 9.0: H100, H200


# ---- candidates ---------------------------------------------------------------------------------------------
def test_persistent_ctas_fill_the_sm_but_never_exceed_the_items():
    assert persistent_ctas(32, n_items=132 * 64, n_sm=132) == 32      # 64 items per SM, 32 resident CTAs
    assert persistent_ctas(32, n_items=132 * 4, n_sm=132) == 4        # 4 items per SM: 4 CTAs are enough
    assert persistent_ctas(32, n_items=133, n_sm=132) == 2            # ceil(133 / 132)
    assert persistent_ctas(2, n_items=132 * 64, n_sm=132) == 2        # a resource-capped kernel
    assert persistent_ctas(None, n_items=10**6, n_sm=132) == 1        # occupancy unknown: one per SM
    assert persistent_ctas(8, n_items=0, n_sm=132) == 1


def test_candidates_start_with_plain_and_keep_affinity_for_workloads_with_classes():
    policies = ("plain", "partition_queues", "affine_weighted", "weighted", "measured", "fastest")
    got = candidates(policies, has_classes=True, n_items=132 * 8, n_sm=132, max_ctas_per_sm=16)
    assert got == (PLAIN, QUEUES, Candidate("affine_weighted", 8), Candidate("weighted", 8))
    got = candidates(policies, has_classes=False, n_items=132 * 8, n_sm=132, max_ctas_per_sm=2)
    assert got == (PLAIN, Candidate("weighted", 2))  # no classes: nothing to be near to; measured never
    assert candidates((), has_classes=True, n_items=5, n_sm=132, max_ctas_per_sm=None) == (PLAIN,)


def test_the_trial_budget_holds_for_any_candidate_list():
    every = candidates(POLICIES, has_classes=True, n_items=10**5, n_sm=132, max_ctas_per_sm=32)
    assert every[0] == PLAIN
    for n in range(1, len(every) + 1):
        assert len(trial_schedule(every[:n], 8)) <= MAX_TRIAL_LAUNCHES
    assert [trial_rounds(n) for n in (1, 2, 4, 5)] == [8, 8, 8, 7]  # 36 launches with 4 candidates, 40 with 5


def test_queues_claim_several_items_where_an_sm_cannot_hold_all_its_programs():
    assert claim_chunk(32, n_items=132 * 64, n_sm=132) == 2     # 64 items per SM, 32 resident: two per claim
    assert claim_chunk(24, n_items=132 * 64, n_sm=132) == 3
    assert claim_chunk(32, n_items=132 * 32, n_sm=132) == 1     # every program resident at once: one per claim
    assert claim_chunk(None, n_items=10**6, n_sm=132) == 1      # occupancy unknown
    policies = ("plain", "partition_queues", "affine_weighted", "weighted")
    got = candidates(policies, has_classes=True, n_items=132 * 64, n_sm=132, max_ctas_per_sm=32)
    assert got == (PLAIN, QUEUES, Candidate("partition_queues", chunk=2), Candidate("affine_weighted", 32),
                   Candidate("weighted", 32))
    assert len(trial_schedule(got, 8)) == MAX_TRIAL_LAUNCHES
    # a chunk asked for by the user is tried as well as the one that keeps the waves
    got = candidates(policies, has_classes=True, n_items=132 * 64, n_sm=132, max_ctas_per_sm=32, chunk=8)
    assert got[1:3] == (Candidate("partition_queues", chunk=8), Candidate("partition_queues", chunk=2))
    # few items per SM: no chunked candidate, the list of before
    assert Candidate("partition_queues", chunk=2) not in candidates(policies, has_classes=True, n_items=132 * 8,
                                                                     n_sm=132, max_ctas_per_sm=32)


def test_trials_are_interleaved_after_one_untimed_round():
    schedule = trial_schedule((PLAIN, QUEUES), 2)
    assert schedule == [(PLAIN, False), (QUEUES, False), (PLAIN, True), (QUEUES, True), (PLAIN, True),
                        (QUEUES, True)]


def test_candidates_check_their_policy_and_grid():
    assert Candidate("uniform", 4).grid(132, 10**6) == 528 and Candidate("uniform", 4).label == "uniform x4"
    assert PLAIN.grid(132, 1000) == 1000 and PLAIN.grid(132, 0) == 1
    queues8 = Candidate("partition_queues", chunk=8)
    assert queues8.grid(132, 1000) == 125 and queues8.grid(132, 1001) == 126 and queues8.label == "partition_queues c8"
    assert queues8.plan_key != QUEUES.plan_key
    assert Candidate("weighted", 2).plan_key == Candidate("weighted", 4).plan_key
    # uniform and dynamic hand each program of the grid an item by its id: their plans depend on the grid
    assert Candidate("uniform", 2).plan_key != Candidate("uniform", 4).plan_key
    assert Candidate("dynamic", 2).plan_key != Candidate("dynamic", 4).plan_key
    with pytest.raises(ValueError, match="several items"):
        Candidate("uniform", 4, chunk=2)
    with pytest.raises(ValueError, match="chunk"):
        Candidate("partition_queues", chunk=0)
    with pytest.raises(ValueError, match="persistent"):
        Candidate("plain", 2)
    with pytest.raises(ValueError, match="persistent"):
        Candidate("uniform")
    with pytest.raises(ValueError, match="policy"):
        Candidate("fastest_please")


# ---- the rule: never slower than plain ------------------------------------------------------------------------
def test_a_clear_winner_beyond_tolerance_is_chosen():
    timings = {PLAIN: [1.00, 1.02, 0.99], QUEUES: [0.90, 0.91, 0.95], Candidate("uniform", 2): [1.10, 1.2, 1.05]}
    assert choose(timings, 0.01) == QUEUES


def test_within_tolerance_plain_is_kept():
    timings = {PLAIN: [1.00, 1.01, 1.00], QUEUES: [0.995, 0.996, 0.999]}
    assert choose(timings, 0.01) == PLAIN
    assert choose(timings, 0.0) == QUEUES


def test_the_median_decides_not_one_lucky_trial():
    assert choose({PLAIN: [1.0, 1.0, 1.0], QUEUES: [0.5, 1.3, 1.2]}, 0.01) == PLAIN


def test_a_noisy_winner_is_not_trusted():
    """Shaped like the H200 gather: a candidate whose median wins but whose spread reaches past plain's
    median is not chosen."""
    timings = {PLAIN: [0.191, 0.190, 0.193, 0.189, 0.192], QUEUES: [0.175, 0.181, 0.178, 0.24, 0.26]}
    assert choose(timings, 0.01) == PLAIN
    timings[QUEUES] = [0.175, 0.181, 0.178, 0.180, 0.182]
    assert choose(timings, 0.01) == QUEUES


def test_a_noisy_fastest_median_does_not_hide_a_steady_winner():
    # the lowest median, but a spread past plain's median; a steadier candidate also beats plain clearly
    noisy, steady = Candidate("affine_weighted", 8), QUEUES
    timings = {PLAIN: [0.411, 0.410, 0.412, 0.411, 0.410], noisy: [0.360, 0.365, 0.370, 0.45, 0.46],
               steady: [0.377, 0.378, 0.376, 0.379, 0.377]}
    assert choose(timings, 0.01) == steady


def test_a_gpu_saving_smaller_than_its_extra_host_time_keeps_plain():
    # queues saves 4 us of GPU time per launch, but its launch costs the host 6 us more (the cursors' reset): an
    # eager call would wait longer for it
    timings = {PLAIN: [0.020, 0.020, 0.021], QUEUES: [0.016, 0.016, 0.016]}
    assert choose(timings, 0.01) == QUEUES
    host = {PLAIN: [0.030, 0.031, 0.029], QUEUES: [0.036, 0.037, 0.035]}
    assert choose(timings, 0.01, host) == PLAIN
    assert host_extra(host) == pytest.approx({PLAIN: 0.0, QUEUES: 0.006})
    host[QUEUES] = [0.031, 0.032, 0.032]  # 1 us more: the 4 us saved still win
    assert choose(timings, 0.01, host) == QUEUES


def test_host_time_below_plains_is_no_credit_and_no_plain_means_no_extra():
    timings = {PLAIN: [0.020, 0.020, 0.020], QUEUES: [0.0199, 0.0199, 0.0199]}
    assert choose(timings, 0.01, {PLAIN: [0.05] * 3, QUEUES: [0.01] * 3}) == PLAIN
    assert host_extra({QUEUES: [0.01]}) == {} and host_extra(None) == {}


def test_a_slower_placement_never_wins_against_plain():
    # recorded shape of the H200 chase at 16 items per SM (a persistent grid of 1 CTA per SM: 1.22x plain)
    timings = {PLAIN: [3.10, 3.12, 3.11], Candidate("affine_weighted", 1): [3.79, 3.80, 3.78]}
    assert choose(timings, 0.01) == PLAIN


def test_without_plain_the_fastest_wins_and_untimed_candidates_are_ignored():
    assert choose({Candidate("uniform", 1): [2.0], Candidate("weighted", 1): [1.5], QUEUES: []}, 0.01) \
        == Candidate("weighted", 1)


def test_no_timings_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        choose({}, 0.01)
    with pytest.raises(ValueError, match="at least one"):
        choose({PLAIN: [], QUEUES: []}, 0.01)
    with pytest.raises(ValueError, match="tolerance"):
        choose({PLAIN: [1.0]}, 1.5)


def test_the_decision_says_in_words_what_was_kept_and_why():
    kept = Decision(PLAIN, {PLAIN: 2.0, QUEUES: 2.1}, {}, 12, 32)
    assert kept.explain().startswith("plain launch kept: placement did not pay here (best other: "
                                     "partition_queues at 1.050x plain)")
    assert "12 trial launches" in kept.explain() and "32 CTAs/SM" in kept.explain()
    won = Decision(QUEUES, {PLAIN: 2.0, QUEUES: 1.8}, {}, 12)
    assert won.explain().startswith("chose partition_queues (") and "0.900x plain" in won.explain()
    assert won.as_dict() == {"policy": "partition_queues", "ctas_per_sm": None, "chunk": 1,
                             "chosen": "partition_queues", "medians": {"plain": 2.0, "partition_queues": 1.8},
                             "launches": 12, "discarded": 0, "max_ctas_per_sm": None, "host_extra_ms": {}}
    paid = Decision(PLAIN, {PLAIN: 0.020, QUEUES: 0.016}, {}, 12, host_extra={PLAIN: 0.0, QUEUES: 0.006})
    assert "+6.0 us host" in paid.explain() and paid.as_dict()["host_extra_ms"] == {"plain": 0.0,
                                                                                   "partition_queues": 0.006}


# ---- occupancy (the CUDA occupancy calculator's arithmetic, cc 9.0) ---------------------------------------------
@pytest.mark.parametrize("threads, regs, shared, expected", [
    (32, 10, 0, 32),          # one-warp CTAs, few registers: the 32-CTA limit
    (128, 64, 0, 8),          # 64 regs x 128 threads = 8192 per CTA: 65536 / 8192
    (128, 16, 0, 16),         # 2048 threads per SM / 128
    (512, 80, 0, 1),          # 80 regs round to 2560 per warp x 16 warps = 40960: one CTA (the capped kernel)
    (256, 32, 100 * 1024, 2),  # shared memory: 228 KB / (100 KB + 1 KB reserved)
    (1024, 255, 0, 0),        # 255 registers x 1024 threads do not fit at all
])
def test_resident_ctas_match_the_occupancy_calculator(threads, regs, shared, expected):
    assert resident_ctas(H100_SM, threads_per_cta=threads, registers_per_thread=regs, shared_bytes=shared) == expected


def test_bad_kernel_resources_are_refused():
    with pytest.raises(ValueError, match="resources"):
        resident_ctas(H100_SM, threads_per_cta=0, registers_per_thread=10, shared_bytes=0)
