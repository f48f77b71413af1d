"""benchmarks/common.py's results tables on CPU: append_rows writes the documented fields, only ever appends (a
run tabulated twice adds nothing), and refuses a bad row before writing anything; write_json appends its rows with
the header it writes. The committed tables (benchmarks/results/*.jsonl) pass the same checks, and the top level of
benchmarks/results holds only them and the README."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402

ENV = {"gpu": "NVIDIA H200", "uuid_hash": "0123456789ab", "date": "2026-12-01T00:00:00+00:00"}
SPREAD = {"p20": 1.0, "p50": 2.0, "p80": 3.0, "n": 9}


def _lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_carry_the_header_and_the_measurement(tmp_path):
    rows = [common.row("gather, 4 MB", "plain", "ms", SPREAD), common.row("gather, 4 MB", "auto_over_plain", "x",
                                                                        1.5)]
    assert common.append_rows("demo", rows, ENV, "python bench_demo.py", "abc123", tmp_path) == 2
    got = _lines(tmp_path / "demo.jsonl")
    assert got == [
        {"benchmark": "demo", "case": "gather, 4 MB", "metric": "plain", "unit": "ms", "gpu": "NVIDIA H200",
         "device_hash": "0123456789ab", "commit": "abc123", "date": "2026-12-01T00:00:00+00:00",
         "command": "python bench_demo.py", "p20": 1.0, "p50": 2.0, "p80": 3.0, "n": 9},
        {"benchmark": "demo", "case": "gather, 4 MB", "metric": "auto_over_plain", "unit": "x", "gpu": "NVIDIA H200",
         "device_hash": "0123456789ab", "commit": "abc123", "date": "2026-12-01T00:00:00+00:00",
         "command": "python bench_demo.py", "value": 1.5}]


def test_a_cpu_run_has_no_device_and_numpy_numbers_become_plain(tmp_path):
    np = pytest.importorskip("numpy")
    env = {"python": "3.12", "date": "2026-12-01T00:00:00+00:00"}
    common.append_rows("demo", [common.row("a", "b", "count", np.int64(3)), common.row("a", "ok", "bool", True)],
                       env, "python bench_demo.py", None, tmp_path)
    got = _lines(tmp_path / "demo.jsonl")
    assert [(r["gpu"], r["device_hash"], r["commit"], r["value"]) for r in got] == [("cpu", None, None, 3),
                                                                                   ("cpu", None, None, 1)]
    assert type(got[0]["value"]) is int


def test_tables_only_grow_and_a_run_tabulated_twice_adds_nothing(tmp_path):
    first = [common.row("c", "m", "s", SPREAD)]
    common.append_rows("demo", first, ENV, "cmd", None, tmp_path)
    before = (tmp_path / "demo.jsonl").read_text()
    assert common.append_rows("demo", first, ENV, "cmd", None, tmp_path) == 0
    later = {**ENV, "date": "2026-12-02T00:00:00+00:00"}
    assert common.append_rows("demo", first, later, "cmd", None, tmp_path) == 1
    after = (tmp_path / "demo.jsonl").read_text()
    assert after.startswith(before) and len(after.splitlines()) == 2


@pytest.mark.parametrize("bad, message", [
    ({"metric": "m", "unit": "s", **SPREAD}, "lacks case"),
    ({"case": "c", "metric": "m", **SPREAD}, "lacks unit"),
    ({"case": "c", "metric": "m", "unit": "s"}, "needs p20, p50 and p80"),
    ({"case": "c", "metric": "m", "unit": "s", "p20": 1.0, "p50": 2.0}, "needs p20, p50 and p80"),
    ({"case": "c", "metric": "m", "unit": "s", "value": 1.0, **SPREAD}, "not both"),
    ({"case": "c", "metric": "m", "unit": "s", "p20": 3.0, "p50": 2.0, "p80": 1.0}, "p20 <= p50 <= p80"),
    ({"case": "c", "metric": "m", "unit": "s", "value": float("nan")}, "not finite"),
    ({"case": "c", "metric": "m", "unit": "s", "value": "fast"}, "not finite"),
    ({"case": "", "metric": "m", "unit": "s", "value": 1.0}, "case must be a non-empty string"),
    ({"case": "c", "metric": "m", "unit": "s", "value": 1.0, "note": "x"}, "unknown fields"),
])
def test_a_bad_row_is_refused_and_nothing_is_written(tmp_path, bad, message):
    good = common.row("c", "m", "s", SPREAD)
    with pytest.raises(ValueError, match=message):
        common.append_rows("demo", [good, bad], ENV, "cmd", None, tmp_path)
    assert not (tmp_path / "demo.jsonl").exists()


def test_a_run_without_a_date_or_a_table_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="date must be a non-empty string"):
        common.append_rows("demo", [common.row("c", "m", "s", 1.0)], {"gpu": "x"}, "cmd", None, tmp_path)
    with pytest.raises(ValueError, match="must name a table"):
        common.append_rows("../demo", [common.row("c", "m", "s", 1.0)], ENV, "cmd", None, tmp_path)


def test_write_json_appends_its_rows_with_the_header_it_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "append_rows", lambda b, rows, env, command, commit: appended.append(
        (b, rows, env, command, commit)))
    appended = []
    path = common.write_json(tmp_path / "run" / "demo.json", {"x": SPREAD}, ENV, "demo",
                             common.quantile_rows({"x": SPREAD, "note": "text"}, "case", "ms"))
    doc = json.loads(path.read_text())
    assert set(doc) == {"command", "commit", "env", "figures"} and doc["env"] == ENV
    assert appended == [("demo", [common.row("case", "x", "ms", SPREAD)], ENV, doc["command"], doc["commit"])]
    common.write_json(tmp_path / "run" / "partial.json", {}, ENV)  # no rows: a partial result, no table row
    assert len(appended) == 1



def test_tabulate_finds_the_benchmark_of_a_command():
    import tabulate_runs

    assert tabulate_runs.script_of("python bench_ops.py --reps 9 --out /tmp/r/ops_h200.json") == "bench_ops"
    script_of = tabulate_runs.script_of
    assert script_of("CUDA_VISIBLE_DEVICES=1 python benchmarks/run_geometry.py --device 0") == "run_geometry"
    assert tabulate_runs.script_of("python benchmarks/bench_fleet.py paper --out x") == "bench_fleet"
    assert tabulate_runs.script_of("python diag_claim_costs.py --out x") is None
    assert tabulate_runs.script_of("python my_bench_ops.py.bak") is None


def test_tabulate_appends_a_result_file_once_and_refuses_a_diagnosis(tmp_path):
    import tabulate_runs

    figures = {"compile_s": {}, "cached_s": SPREAD, "cold_s": {"triton/waves": SPREAD},
               "maps": {"triton/waves": {"chain_mean": 284.0}},
               "repeat": {"triton/waves": {"chain": {"max_after_offset": 0.1}}}}
    run = tmp_path / "calibrate.json"
    run.write_text(json.dumps({"command": "python bench_calibrate.py --device 0 --out x", "commit": "abc",
                               "env": ENV, "figures": figures}))
    assert tabulate_runs.tabulate(run, tmp_path) == ("calibrate", 4)
    assert tabulate_runs.tabulate(run, tmp_path) == ("calibrate", 0)
    got = {(r["case"], r["metric"]): r.get("value", r.get("p50")) for r in _lines(tmp_path / "calibrate.jsonl")}
    assert got == {("cold", "triton/waves"): 2.0, ("cached", "calibrate"): 2.0,
                   ("triton/waves", "chain_mean"): 284.0, ("triton/waves", "repeat_max_after_offset"): 0.1}
    diag = tmp_path / "diag.json"
    diag.write_text(json.dumps({"command": "python diag_claim_costs.py --out x", "env": ENV, "figures": {}}))
    with pytest.raises(ValueError, match="names no benchmark"):
        tabulate_runs.tabulate(diag, tmp_path)


def test_the_committed_tables_pass_the_checks_and_stand_alone_at_the_top():
    results = ROOT / "benchmarks" / "results"
    tables = sorted(results.glob("*.jsonl"))
    assert len(tables) >= 15
    for table in tables:
        rows = _lines(table)
        assert rows, f"{table.name} is empty"
        for r in rows:
            common.check_row(r)
            assert r["benchmark"] == table.stem, f"{table.name}: a row of {r['benchmark']}"
    loose = sorted(p.name for p in results.iterdir() if p.is_file() and p.suffix != ".jsonl")
    assert loose == ["README.md"], f"files at the top of benchmarks/results besides the tables: {loose}"
    readme = (results / "README.md").read_text()
    assert all(f"`{t.name}`" in readme for t in tables), "benchmarks/results/README.md names every table"
