"""benchmarks/bench_ops.py without a GPU: its row functions run on the CPU (the ops' CPU paths, a host timer in
place of CUDA events, no graphs), so the rows it writes carry every column the issue asks for, its ratios are
times over times, and its checks against torch and scikit-learn run. Device time is scarce: a benchmark that
crashes after the GPU is started wastes it."""
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_ops  # noqa: E402

COLUMNS = {"time_ms", "vs_reference", "vs_plain", "auto_chose", "reference", "impl"}


def _host_rounds(launches: dict, reps: int) -> dict:
    out = {}
    for name, launch in launches.items():
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            launch()
            times.append(1e3 * (time.perf_counter() - start))
        out[name] = {**bench_ops.quantiles(times), "inner": 1}
    return out


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(bench_ops, "DEVICE", "cpu")
    monkeypatch.setattr(bench_ops, "gpu_rounds", _host_rounds)
    monkeypatch.setattr(bench_ops, "graphed", lambda fn, calls=1: lambda: [fn() for _ in range(calls)])


def test_embedding_bag_rows(on_cpu):
    eager, graph = bench_ops.bag_rows(1, 16, "float32", 4, 64, "sum", reps=2)
    for row in (eager, graph):
        assert COLUMNS <= set(row) and row["auto_chose"] == "plain"
        assert row["reference"] in ("F.embedding_bag", "nn.EmbeddingBag")
        assert row["vs_reference"] == pytest.approx(row["time_ms"] / row["impl"][row["reference"]]["p50"])
        assert row["vs_plain"] == pytest.approx(row["time_ms"] / row["impl"]["plain"]["p50"])
    assert {"ours", "ours_unchecked", "plain", "F.embedding_bag", "nn.EmbeddingBag"} == set(eager["impl"])
    assert eager["max_abs_err"] < 1e-5 and eager["timing"] == "eager" and graph["timing"] == "graph"
    assert all(t["calls_per_graph"] == bench_ops.GRAPH_CALLS for t in graph["impl"].values())


def test_graph_rows_are_per_call_and_only_references_may_fail_to_capture(monkeypatch):
    captured = []

    def fake_graphed(fn, calls=1):
        fn()  # a capture runs the call once
        captured.append(calls)
        return fn

    def fake_rounds(launches, reps):  # every replay "takes" 10 ms per call it holds
        return {name: {**bench_ops.quantiles([10.0 * bench_ops.GRAPH_CALLS] * reps), "inner": 3} for name in launches}

    def refuses():
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(bench_ops, "graphed", fake_graphed)
    monkeypatch.setattr(bench_ops, "gpu_rounds", fake_rounds)
    out = bench_ops.graph_rounds({"ours": lambda: None, "torch": refuses}, reps=4, optional=("torch",))
    assert captured == [bench_ops.GRAPH_CALLS]
    assert out["ours"]["p50"] == pytest.approx(10.0) and out["ours"]["p20"] == pytest.approx(10.0)
    assert out["ours"]["calls_per_graph"] == bench_ops.GRAPH_CALLS and out["ours"]["inner"] == 3
    assert out["torch"]["skipped"].startswith("failed: RuntimeError: operation not permitted")
    with pytest.raises(RuntimeError, match="capturing"):
        bench_ops.graph_rounds({"ours": refuses}, reps=4, optional=("torch",))


def test_forest_rows(on_cpu, monkeypatch):
    pytest.importorskip("sklearn")
    monkeypatch.setattr(bench_ops, "_hummingbird", lambda model, trees, depth: {
        s: "skipped: not on this machine" for s in bench_ops.HUMMINGBIRD_STRATEGIES})
    import torch

    x = torch.from_numpy(np.random.default_rng(0).normal(size=(64, bench_ops.N_FEATURES)).astype(np.float32))
    monkeypatch.setattr(bench_ops, "_fit", _small_fit)
    rows = bench_ops.forest_rows("random_forest", 5, 3, x, (1, 64), reps=2, label="test")
    assert [r["batch"] for r in rows] == [1, 64]
    for row in rows:
        assert COLUMNS <= set(row) and row["vs_reference"] is None  # no Hummingbird here: no reference ratio
        assert row["fastest_layout"] in ("bfs", "dfs", "blocks") and row["max_abs_err"] < 1e-12
        assert row["impl"]["hummingbird_gemm"] == {"skipped": "skipped: not on this machine"}
        assert row["vs_sklearn_cpu"] == pytest.approx(row["time_ms"] / row["impl"]["sklearn_cpu"]["p50"])


def _small_fit(kind, trees, depth):
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, bench_ops.N_FEATURES)).astype(np.float32)
    return RandomForestClassifier(n_estimators=trees, max_depth=depth, random_state=0).fit(x, x[:, 0] > 0)


def test_grids():
    assert bench_ops.TARGET in bench_ops.BAG_GRIDS["default"]
    for grid in bench_ops.BAG_GRIDS.values():
        for table_mb, dim, dtype, bag, batch, mode in grid:
            row_bytes = dim * {"float32": 4, "bfloat16": 2}[dtype]
            assert 32 <= row_bytes <= 1024 and 1 <= bag <= 256 and 1 <= batch <= 65536 and table_mb <= 4096
            assert mode in ("sum", "mean", "max")
    full_bags = bench_ops.BAG_GRIDS["full"]
    assert {r[0] for r in full_bags} >= {1, 4096} and {r[3] for r in full_bags} >= {1, 256}
    models, batches = bench_ops.FOREST_GRIDS["full"]
    assert min(b for b in batches) == 1 and max(batches) >= 10 ** 6
    assert {t for _, t, _ in models} >= {10, 2000} and {d for _, _, d in models} >= {4, 12}


def test_forest_rows_with_hummingbird(on_cpu, monkeypatch):
    pytest.importorskip("hummingbird.ml")  # not in the test extra: runs where it is installed
    import torch

    monkeypatch.setattr(bench_ops, "_fit", _small_fit)
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(32, bench_ops.N_FEATURES)).astype(np.float32))
    (row,) = bench_ops.forest_rows("random_forest", 4, 3, x, (32,), reps=2, label="test")
    assert row["reference"].startswith("hummingbird_") and row["vs_reference"] > 0
    assert all("p50" in row["impl"][f"hummingbird_{s}"] for s in bench_ops.HUMMINGBIRD_STRATEGIES)


def test_report_renders_tables_and_figures(on_cpu, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("sklearn")
    import json

    import report_ops
    import torch

    bag_rows = [r for batch in (1, 64) for r in bench_ops.bag_rows(16, 64, "float32", 32, batch, "sum", reps=2)]
    monkeypatch.setattr(bench_ops, "_fit", _small_fit)
    monkeypatch.setattr(bench_ops, "_hummingbird", lambda model, trees, depth: {
        s: "skipped: not on this machine" for s in bench_ops.HUMMINGBIRD_STRATEGIES})
    x = torch.zeros(16, bench_ops.N_FEATURES)
    forest_rows = bench_ops.forest_rows("random_forest", 3, 2, x, (1, 16), reps=2, label="test")
    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"command": "python benchmarks/bench_ops.py", "env": {"gpu": "test"},
                                "figures": {"embedding_bag": bag_rows, "forest": forest_rows}}))
    text = report_ops.main(["--from", str(path), "--figures", str(tmp_path / "figures")])
    assert text.count("| 16 MB | 64 x float32 | 32 x ") == 4  # two batches, eager and graph
    assert "| random_forest 3 x d2 |" in text and "n/a" in text  # no Hummingbird here: no reference ratio
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["ops_embedding_bag.png", "ops_forest.png"]
    # the same rows from the slices of a grid (--part K/N): the same tables, every file named
    parts = []
    for k, rows in enumerate(([*bag_rows[:2]], [*bag_rows[2:]], forest_rows), 1):
        parts.append(tmp_path / f"part{k}.json")
        parts[-1].write_text(json.dumps({"command": f"bench_ops.py --part {k}/3", "env": {"gpu": "test"}, "figures": {
            "embedding_bag": rows if k < 3 else [], "forest": rows if k == 3 else []}}))
    sliced = report_ops.main(["--from", *map(str, parts)])
    assert sliced.split("\n", 1)[1] == text.split("\n", 1)[1] and sliced.count("--part") == 3


def test_parts_cover_a_grid_once_in_order():
    items = list(range(11))
    for n in (1, 2, 3, 6, 11, 12):
        parts = [bench_ops.part_of(items, (k, n)) for k in range(1, n + 1)]
        assert sum(parts, []) == items and all(len(p) <= -(-len(items) // n) for p in parts)
    assert bench_ops.parse_part("2/6") == (2, 6)
    for bad in ("0/3", "4/3", "2", "a/b", "1/0"):
        with pytest.raises(bench_ops.argparse.ArgumentTypeError):
            bench_ops.parse_part(bad)


def test_sklearn_cpu_timing_skips_a_call_that_would_take_too_long(monkeypatch):
    pytest.importorskip("sklearn")
    model = _small_fit("random_forest", 5, 3)
    x = np.random.default_rng(2).normal(size=(256, bench_ops.N_FEATURES)).astype(np.float32)
    timed = bench_ops.sklearn_cpu_timing(model, x, reps=2)
    assert timed["p50"] > 0 and timed["n"] >= 1
    monkeypatch.setattr(bench_ops, "CPU_SECONDS", 0.0)  # any call is now too long: skipped, with the reason
    monkeypatch.setattr(bench_ops, "CPU_PROBE_SAMPLES", 16)
    skipped = bench_ops.sklearn_cpu_timing(model, x, reps=2)
    assert set(skipped) == {"skipped"} and "16 samples timed" in skipped["skipped"]


def test_forest_rows_without_a_cpu_timing(on_cpu, monkeypatch):
    pytest.importorskip("sklearn")
    monkeypatch.setattr(bench_ops, "_hummingbird", lambda model, trees, depth: {
        s: "skipped: not on this machine" for s in bench_ops.HUMMINGBIRD_STRATEGIES})
    monkeypatch.setattr(bench_ops, "_fit", _small_fit)
    monkeypatch.setattr(bench_ops, "CPU_SECONDS", 0.0)
    import torch

    x = torch.from_numpy(np.random.default_rng(3).normal(size=(8, bench_ops.N_FEATURES)).astype(np.float32))
    (row,) = bench_ops.forest_rows("random_forest", 3, 3, x, (8,), reps=2, label="test")
    assert "skipped" in row["impl"]["sklearn_cpu"] and row["vs_sklearn_cpu"] is None


def test_an_entry_slower_than_the_slow_call_limit_is_timed_by_one_call(monkeypatch):
    import torch

    calls = {"a": 0, "b": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(bench_ops, "_event_ms", lambda fn, n=1: fn() or 2500.0 * n)  # every call "takes" 2.5 s
    launches = {name: (lambda name=name: calls.__setitem__(name, calls[name] + 1)) for name in calls}
    out = bench_ops.gpu_rounds(launches, reps=5)
    assert calls == {"a": 2, "b": 2}  # the warm-up call and the one timed call, no probe, no rounds
    assert all(t["one_call"] and t["n"] == 1 and t["p50"] == 2500.0 and t["inner"] == 1 for t in out.values())
