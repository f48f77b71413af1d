"""GPU tests of placement: with every policy and CTAs per SM, in both backends, every item is processed exactly
once (the checksum kernels of triton_kernels/placement_demo.py and cuda_ext/placement_demo.cu count each
item's visits), also next to a kernel holding half the SMs, under CUDA graph replays (the last CTA out resets
shares mode; the captured memset resets queues mode) and inside torch.compile; the statistics add up; a
corrupted plan is refused on the device; "auto" is not slower than a hand-written plain kernel on a small chase
(a wide tolerance: the benchmark carries the tight targets).

No timing is asserted here: which policy is faster is a benchmark's question.
"""
import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

N_OUT = 61            # checksum slots: prime, so every share's items spread over all of them
SIZES = (1, 1000, 100003)
BACKENDS = ("triton", "cuda")
TRITON_WARPS = 4      # more than one warp: the helpers' scalar atomics must still run once per program
OCCUPY_S = 3.0        # the occupier holds its SMs far longer than a placement launch takes (milliseconds)
MAX_AUTO_LAUNCHES = 45  # "auto" decides after (1 + trials) x candidates launches, at most 40 (choice.py)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """(device, its calibration), calibrated into a private cache that later lazy calibrate() calls hit."""
    import torch

    import torch_l2topo

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_L2TOPO_CACHE", str(tmp_path_factory.mktemp("cache")))
        dev = torch.device("cuda", 0)
        yield dev, torch_l2topo.calibrate(dev)


def _classes(n):
    return np.random.default_rng(n).integers(0, 3, n)


def _buffers(dev, n):
    import torch

    return torch.zeros(N_OUT, dtype=torch.int64, device=dev), torch.zeros(max(n, 1), dtype=torch.int32, device=dev)


def _placed(backend, dev, policy, topo=None, **options):
    """(placement, run): run(out, count, n, classes) launches the checksum kernel once through `placement`
    (an @sm_aware kernel for Triton, a Placement around the CUDA op), whose slots, stats and decisions the
    tests read. topo None: the lazy calibrate() path."""
    import torch

    from torch_l2topo.measure.launch import launch
    from torch_l2topo.placement.sm_aware import Placement, sm_aware
    from torch_l2topo.triton_kernels.placement_demo import checksum_kernel

    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    options = dict(options, policy=policy, topology=topo, k=n_sm // 2 if policy == "fastest" else None)
    if backend == "triton":
        kernel = sm_aware(num_warps=TRITON_WARPS, **options)(checksum_kernel)

        def run(out, count, n, classes):
            kernel(out, count, N_OUT, n_items=n, item_class=classes)

        return kernel, run
    # the CUDA demo: CTAs of 4 warps; its occupancy is not read from the binary, so it is given
    placement = Placement(max_ctas_per_sm=options.pop("max_ctas_per_sm", 4), **options)

    def run(out, count, n, classes):
        placement(lambda grid, plan, state, place: launch("placement_demo", "cuda", grid, out, count, N_OUT, plan,
                                                          state, place), n_items=n, item_class=classes, device=dev)

    return placement, run


def _check(out, count, n, launches):
    import torch

    from torch_l2topo.triton_kernels.placement_demo import checksum_reference

    torch.cuda.synchronize()
    seen = count.cpu().numpy()[:n]
    bad = np.flatnonzero(seen != launches)
    assert bad.size == 0, (f"{bad.size} of {n} items not processed exactly {launches}x: items {bad[:8].tolist()} "
                           f"seen {seen[bad[:8]].tolist()}")
    np.testing.assert_array_equal(out.cpu().numpy(), launches * checksum_reference(n, N_OUT))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("policy", ["uniform", "dynamic", "weighted", "fastest", "partition_affine",
                                    "affine_weighted", "measured", "plain", "partition_queues", "auto"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_item_is_processed_exactly_once(gpu, backend, policy, n):
    import torch

    from torch_l2topo.placement.plans import POLICIES
    from torch_l2topo.placement.sm_aware import workload_key

    assert policy in (*POLICIES, "auto")
    dev, topo = gpu
    placement, run = _placed(backend, dev, policy, topo)
    classes = _classes(n)
    out, count = _buffers(dev, n)
    run(out, count, n, classes)
    _check(out, count, n, 1)
    launches = 2
    run(out, count, n, classes)  # the first launch's last CTA left the state clean
    if policy == "auto":  # through every trial to the decision, then once with the choice
        key = workload_key(n, classes)
        while key not in placement.decisions:
            assert launches < MAX_AUTO_LAUNCHES, "auto did not decide"
            torch.cuda.synchronize()  # the test waits so the events complete; auto itself never does
            run(out, count, n, classes)
            launches += 1
        decision = placement.decisions[key]
        tried = {c.policy for c in decision.medians}
        assert decision.chosen in decision.medians and {"plain", "partition_queues", "affine_weighted"} <= tried
        run(out, count, n, classes)
        launches += 1
    _check(out, count, n, launches)
    used = placement.decisions[workload_key(n, classes)].policy if policy == "auto" else policy
    assert not placement.slot(n, classes, policy=used, device=dev).error()


@pytest.mark.parametrize("short", [0, 5])
@pytest.mark.parametrize("policy", ["uniform", "dynamic"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_grid_as_large_as_the_items_claims_nothing(gpu, backend, policy, short):
    """uniform and dynamic hand each program of the grid its item by program id: with as many programs as items
    (or 5 more) nothing is claimed, so no program counts itself out: a stray value in the finish count survives
    the launches (a count would move it, or the last program out would zero it)."""
    from torch_l2topo.layout import STATE_FINISHED

    dev, topo = gpu
    ctas = 2
    n = ctas * topo.n_sm - short
    placement, run = _placed(backend, dev, policy, topo, ctas_per_sm=ctas)
    classes = _classes(n)
    out, count = _buffers(dev, n)
    run(out, count, n, classes)
    slot = placement.slot(n, classes, policy=policy, device=dev)
    assert slot.loaded.n_first == n and len(slot.loaded.items) == len(slot.loaded.tail) == 0
    slot.state[STATE_FINISHED] = -(2**40)
    for _ in range(2):
        run(out, count, n, classes)
    _check(out, count, n, 3)
    assert slot.state[STATE_FINISHED].item() == -(2**40)
    stats = slot.stats()
    assert stats["items"].sum() == 3 * n and stats["ctas"].sum() == 3 * ctas * topo.n_sm


@pytest.mark.parametrize("ctas_per_sm", [1, 2, 3, 8, 32])
@pytest.mark.parametrize("policy", ["affine_weighted", "dynamic", "uniform"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_item_once_at_every_ctas_per_sm(gpu, backend, policy, ctas_per_sm):
    dev, topo = gpu
    n = 100003
    placement, run = _placed(backend, dev, policy, topo, ctas_per_sm=ctas_per_sm)
    classes = _classes(n)
    out, count = _buffers(dev, n)
    for _ in range(2):
        run(out, count, n, classes)
    _check(out, count, n, 2)
    stats = placement.slot(n, classes, policy=policy, device=dev).stats()
    assert stats["items"].sum() == 2 * n and stats["ctas"].sum() == 2 * ctas_per_sm * topo.n_sm


@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("backend", BACKENDS)
def test_partition_queues_do_every_item_once_at_every_chunk(gpu, backend, chunk):
    dev, topo = gpu
    n = 100003
    placement, run = _placed(backend, dev, "partition_queues", topo, chunk=chunk)
    classes = _classes(n)
    out, count = _buffers(dev, n)
    for _ in range(3):  # the memset before each launch starts the cursors over
        run(out, count, n, classes)
    _check(out, count, n, 3)
    assert placement.grid(dev, n_items=n) == -(-n // chunk)


@pytest.mark.parametrize("backend", BACKENDS)
def test_measured_rebuilds_its_plan_from_device_statistics(gpu, backend):
    import torch

    dev, topo = gpu
    n = 100003
    placement, run = _placed(backend, dev, "measured", topo, refresh=2)
    out, count = _buffers(dev, n)
    run(out, count, n, None)
    first = placement.slot(n, policy="measured", device=dev).loaded
    for _ in range(5):  # a snapshot after launch 2, read (the test waits for it) and rebuilt before launch 3
        torch.cuda.synchronize()
        run(out, count, n, None)
    _check(out, count, n, 6)
    rebuilt = placement.slot(n, policy="measured", device=dev).loaded
    assert rebuilt is not first and rebuilt.policy == "measured"
    rebuilt.validate(n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_statistics_after_a_launch_sum_to_the_items(gpu, backend):
    dev, _ = gpu
    n = 100003
    placement, run = _placed(backend, dev, "weighted")  # lazy calibrate(): the module's cached calibration
    out, count = _buffers(dev, n)
    run(out, count, n, None)
    _check(out, count, n, 1)
    slot = placement.slot(n, policy="weighted", device=dev)
    stats = slot.stats()
    assert stats["items"].sum() == n
    assert stats["ctas"].sum() == placement.grid(dev, n_items=n)  # every %smid of an H200 is a plan slot
    ran = stats["ctas"] > 0
    assert (stats["busy_ns"][ran] > 0).all() and (stats["busy_ns"][~ran] == 0).all()
    assert not slot.error()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_item_once_while_half_the_sms_are_occupied(gpu, backend):
    import torch

    from torch_l2topo.triton_kernels.occupy import BLOCKS_PER_SM, occupy_sms

    dev, topo = gpu
    n = 100003
    placement, run = _placed(backend, dev, "weighted", topo)
    out, count = _buffers(dev, n)
    run(out, count, n, None)  # builds the plan and compiles: under the occupier only the launch runs
    _check(out, count, n, 1)
    slot = placement.slot(n, policy="weighted", device=dev)
    before = slot.stats()["items"]
    out.zero_()
    count.zero_()
    busy = list(range(0, topo.n_sm, 2))
    stream, held = occupy_sms(dev, busy, OCCUPY_S)
    released = torch.cuda.Event()
    released.record(stream)
    try:
        time.sleep(0.2)  # the occupier's CTAs on the other SMs have exited, its SMs are held
        run(out, count, n, None)
        done = torch.cuda.Event()
        done.record()
        deadline = time.monotonic() + OCCUPY_S + 30.0
        while not done.query():
            assert time.monotonic() < deadline, "the placement kernel did not finish"
            time.sleep(0.001)
        finished_while_held = not released.query()
    finally:
        stream.synchronize()
    _check(out, count, n, 1)
    items = slot.stats()["items"] - before
    assert items.sum() == n
    if finished_while_held:  # no CTA of ours could sit on a fully held SM: their shares were stolen
        full = held.cpu().numpy() == BLOCKS_PER_SM
        assert full.any() and (items[full] == 0).all(), items[full]


@pytest.mark.parametrize("policy", ["weighted", "partition_queues", "plain", "auto"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_replays_start_clean(gpu, backend, policy):
    import torch

    from torch_l2topo.placement.sm_aware import workload_key

    dev, topo = gpu
    n = 1000
    placement, run = _placed(backend, dev, policy, topo)
    out, count = _buffers(dev, n)
    classes = _classes(n)
    run(out, count, n, classes)  # eager first: builds the plan
    launches = 1
    while policy == "auto" and workload_key(n, classes) not in placement.decisions:  # a graph needs the choice
        torch.cuda.synchronize()
        run(out, count, n, classes)
        launches += 1
    torch.cuda.synchronize()
    _check(out, count, n, launches)
    out.zero_()
    count.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            run(out, count, n, classes)
    torch.cuda.synchronize()
    out.zero_()
    count.zero_()
    for _ in range(5):
        graph.replay()
    _check(out, count, n, 15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_captured_before_its_decision_runs_plain(gpu, backend):
    """A graph captured after one eager launch of "auto" (its first trial: plain) replays plain: every item once,
    and no trial candidate is frozen into the graph."""
    import torch

    dev, topo = gpu
    n = 1000
    placement, run = _placed(backend, dev, "auto", topo)
    classes = _classes(n)
    out, count = _buffers(dev, n)
    run(out, count, n, classes)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(out, count, n, classes)
    for _ in range(4):
        graph.replay()
    _check(out, count, n, 5)
    assert not placement.decisions  # the captured launch took no trial


def test_capture_without_a_plan_is_a_clear_error(gpu):
    import torch

    from torch_l2topo import PlacementError

    dev, topo = gpu
    _, run = _placed("triton", dev, "weighted", topo)
    out, count = _buffers(dev, 10)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(PlacementError, match="launch the kernel once"):
        with torch.cuda.graph(graph):
            run(out, count, 10, None)
    torch.cuda.synchronize()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_corrupted_plan_sets_the_error_flag_and_processes_nothing(gpu, backend):

    from torch_l2topo.layout import PLACE_SHARES, PLAN_MAGIC, STATE_CURSORS, STATE_ERROR, STATE_FINISHED, STATE_TAIL
    from torch_l2topo.measure.launch import launch
    from torch_l2topo.placement.plans import SpeedModel, Workload, make_plan
    from torch_l2topo.placement.slots import PlanSlot

    dev, topo = gpu
    n = 1000
    slot = PlanSlot(dev, topo.n_sm)
    plan = make_plan("weighted", SpeedModel.from_topology(topo), Workload(n))
    out, count = _buffers(dev, n)

    def run():
        launch("placement_demo", backend, topo.n_sm, out, count, N_OUT, slot.plan, slot.state, PLACE_SHARES)

    slot.load(plan)
    slot.plan[PLAN_MAGIC] = 0
    run()
    assert slot.error()
    assert int(count.sum()) == 0 and int(out.sum()) == 0
    state = slot.state.cpu().numpy()
    assert state[STATE_ERROR] == 1 and state[STATE_TAIL] == 0 and state[STATE_FINISHED] == 0  # reset by the last CTA
    assert not state[STATE_CURSORS:].any()  # no cursor claimed, no statistic counted
    slot.load(plan)  # a good plan again: the flag is cleared and the state was left clean
    assert not slot.error()
    run()
    _check(out, count, n, 1)


def test_sm_aware_call_inside_torch_compile_is_a_graph_break(gpu):
    import torch

    dev, topo = gpu
    n = 1000
    kernel, _ = _placed("triton", dev, "weighted", topo)

    @torch.compile
    def step(x, out, count):
        y = x * 2
        kernel(out, count, N_OUT, n_items=n)
        return y + 1

    out, count = _buffers(dev, n)
    x = torch.arange(8.0, device=dev)
    assert torch.equal(step(x, out, count), x * 2 + 1)
    assert torch.equal(step(x, out, count), x * 2 + 1)
    _check(out, count, n, 2)


_CHECKSUM_OP = []


def _checksum_op():
    """A fixed-policy torch.library.triton_op around the Triton checksum kernel (sm_aware's docstring recipe);
    registered once per process."""
    if not _CHECKSUM_OP:
        import torch
        from torch.library import triton_op, wrap_triton

        from torch_l2topo.triton_kernels.placement_demo import checksum_kernel

        @triton_op("l2topo_test::placement_checksum", mutates_args={"out", "count", "state"})
        def placement_checksum(out: torch.Tensor, count: torch.Tensor, n_out: int, plan: torch.Tensor,
                               state: torch.Tensor, grid: int, place: int) -> None:
            wrap_triton(checksum_kernel)[(grid,)](out, count, n_out, plan, state, place, num_warps=TRITON_WARPS)

        _CHECKSUM_OP.append(placement_checksum)
    return _CHECKSUM_OP[0]


@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
def test_fixed_policy_triton_op_compiles_without_a_graph_break(gpu, compile_backend):
    import torch

    dev, topo = gpu
    n = 1000
    kernel, _ = _placed("triton", dev, "weighted", topo)
    plan, state = kernel.plan_tensors(n, device=dev)
    grid, place = kernel.grid(dev, n_items=n), kernel.place("weighted")
    op = _checksum_op()

    @torch.compile(backend=compile_backend, fullgraph=True)
    def step(x, out, count, plan, state):
        op(out, count, N_OUT, plan, state, grid, place)
        return x * 2

    out, count = _buffers(dev, n)
    x = torch.arange(8.0, device=dev)
    for _ in range(3):
        assert torch.equal(step(x, out, count, plan, state), x * 2)
    _check(out, count, n, 3)
    assert kernel.slot(n, policy="weighted", device=dev).stats()["items"].sum() == 3 * n


def test_auto_is_not_slower_than_a_hand_written_plain_kernel_on_a_small_chase(gpu):
    """The benchmark's latency-bound chase at 4 items per SM (2 MB rings, 1280 loads per item): auto against
    the same loop without the helpers, one program per item, in interleaved rounds. A wide tolerance (15%):
    the benchmark (benchmarks/bench_placement.py) carries the tight targets."""
    import os
    import sys

    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from placement_workloads import chase_kernel, chase_plain_kernel, chase_workload

    from torch_l2topo.placement.sm_aware import sm_aware

    dev, topo = gpu
    n = 4 * topo.n_sm
    w = chase_workload(dev, 2 << 20, n, 1280)
    ends = torch.zeros(n, dtype=torch.int64, device=dev)
    kernel = sm_aware(chase_kernel, num_warps=1, topology=topo)
    while not kernel.decisions:
        kernel(w.starts, ends, w.loads, n_items=n, item_class=w.classes)
        torch.cuda.synchronize()
    assert (ends.cpu().numpy() == w.expected).all()
    runs = {"auto": lambda: kernel(w.starts, ends, w.loads, n_items=n, item_class=w.classes),
            "plain": lambda: chase_plain_kernel[(n,)](w.starts, ends, w.loads, num_warps=1)}
    replays = {}
    for name, run in runs.items():  # GPU time: CUDA graphs, so the host's launch cost is not timed
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        replays[name] = graph.replay
    times = {name: [] for name in runs}
    for _ in range(15):  # interleaved rounds: drift touches both alike
        for name, replay in replays.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    assert np.median(times["auto"]) <= 1.15 * np.median(times["plain"]), (kernel.explain(), times)


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_tries_queues_with_several_items_per_claim_where_sms_cannot_hold_every_program(gpu, backend):
    """64 items per SM against a kernel an SM holds 4 CTAs of: "auto" also times partition_queues at
    claim_chunk()'s items per claim, within the trial budget, and every item is done once through all trials."""
    import torch

    from torch_l2topo.placement.choice import MAX_TRIAL_LAUNCHES, Candidate, claim_chunk
    from torch_l2topo.placement.sm_aware import workload_key

    dev, topo = gpu
    n = 64 * topo.n_sm
    placement, run = _placed(backend, dev, "auto", topo, max_ctas_per_sm=4)
    classes = _classes(n)
    out, count = _buffers(dev, n)
    key, launches = workload_key(n, classes), 0
    while key not in placement.decisions:
        assert launches < MAX_AUTO_LAUNCHES, "auto did not decide"
        run(out, count, n, classes)
        launches += 1
        torch.cuda.synchronize()
    _check(out, count, n, launches)
    decision = placement.decisions[key]
    chunked = Candidate("partition_queues", chunk=claim_chunk(4, n, topo.n_sm))
    assert chunked.chunk == 16 and chunked in decision.timings and decision.launches <= MAX_TRIAL_LAUNCHES
