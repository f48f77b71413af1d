"""GPU tests of green contexts (torch_l2topo.placement.green_contexts): the driver's SM groups partition the device, a
context built from chosen groups runs work on exactly their SMs (a census of many programs, against the
union of the groups' own censuses and the driver's SM counts), ops inside on_sms() compute what they compute
outside and are ordered with the caller's stream, and a CUDA graph captured on the green stream replays
there. Skipped without cuda-python (the `green` extra)."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    import torch

    pytest.importorskip("cuda.bindings.driver")
    from torch_l2topo.placement.green_contexts import sm_groups

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_L2TOPO_CACHE", str(tmp_path_factory.mktemp("cache")))
        dev = torch.device("cuda", 0)
        yield dev, sm_groups(dev)


def test_groups_partition_the_device(groups):
    import torch

    dev, gs = groups
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    ids = [s for g in gs for s in g.sms]
    assert len(ids) == len(set(ids)), "a SM appears in two groups"
    assert sorted(ids) == list(range(n_sm)), "the groups do not cover every SM"


def test_a_context_of_chosen_groups_runs_on_exactly_their_sms(groups):
    from torch_l2topo.placement.green_contexts import census, group_stream

    dev, gs = groups
    chosen = [gs[0], gs[len(gs) // 2], gs[-1]]
    seen = census(group_stream(chosen, dev), 4096)
    assert seen == tuple(sorted(s for g in chosen for s in g.sms))


def test_on_sms_computes_the_same_and_orders_with_the_caller(groups):
    import torch

    import torch_l2topo

    dev, _ = groups
    # integers: a float cumsum on fewer SMs may add in another order and differ in the last bits
    x = torch.randint(-1000, 1000, (1 << 20,), device=dev)
    y = x * 3  # queued on the caller's stream before the block: the green stream must wait for it
    with torch_l2topo.on_sms(16, near=0) as sel:
        z = torch.cumsum(y, 0)
        assert torch.cuda.current_stream(dev) == sel.stream
    w = z + 1  # on the caller's stream after the block: it must see z complete
    assert torch.equal(w, torch.cumsum(x * 3, 0) + 1)
    assert sel.sms is not None and len(sel.sms) >= 16
    topo = torch_l2topo.calibrate(dev)
    part = torch_l2topo.sm_labels(topo).partition
    assert np.all(part[list(sel.sms)] == 0), "near=0 chose SMs outside partition 0 although 16 fit in it"


def test_graph_captured_on_the_green_stream_replays_on_its_sms(groups):
    import torch

    import torch_l2topo
    from torch_l2topo.measure.launch import launch

    dev, _ = groups
    out = torch.full((2048,), -1, dtype=torch.int64, device=dev)
    with torch_l2topo.on_sms(24) as sel:
        launch("sm_census", "triton", out.numel(), out, 1000)  # compile outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=sel.stream):
            launch("sm_census", "triton", out.numel(), out, 1000)
    out.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert set(out.cpu().tolist()) <= set(sel.sms)
