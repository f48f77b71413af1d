"""What every benchmark records with its figures: device, versions, clocks, date, commit and its own command.

A run writes its full result as one JSON object, {"command", "commit", "env", "figures"}, where --out says, and
appends its key figures as tidy rows to its benchmark's table, benchmarks/results/<benchmark>.jsonl (append_rows:
one JSON object per line, ROW_FIELDS), so results from different days and GPUs can be compared row by row.
benchmarks/results/README.md says how to read the tables.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from torch_l2topo.files import json_default
from torch_l2topo.measure.timing import Measurement

RESULTS = Path(__file__).resolve().parent / "results"
# Every row of a table has these fields, and either QUANTILES (a spread; "n" optional) or "value" (a scalar)
ROW_FIELDS = ("benchmark", "case", "metric", "unit", "gpu", "device_hash", "commit", "date", "command")
QUANTILES = ("p20", "p50", "p80")


def environment(device_index: int = 0) -> dict:
    import torch

    from torch_l2topo.device import board_serial_hash, device_info
    from torch_l2topo.version import __version__

    info = device_info(device_index)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"gpu": info.name, "uuid_hash": info.uuid_hash, "serial_hash": board_serial_hash(device_index),
            "cc": list(info.cc), "sm_count": info.sm_count,
            "l2_bytes": info.l2_bytes, "driver": info.driver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton_version, "torch_l2topo": __version__,
            "clocks": _smi_clocks(device_index),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def cpu_environment() -> dict:
    """The environment of a CPU-only benchmark (analysis of recorded calibrations): versions, CPU, date."""
    import platform

    import scipy

    from torch_l2topo.version import __version__

    return {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
            "torch_l2topo": __version__, "machine": platform.machine(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def _smi_clocks(index: int) -> dict:
    """SM/memory clocks as nvidia-smi reports them now (best effort; empty if nvidia-smi is missing)."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        sm, mem, max_sm = (int(x) for x in out.stdout.strip().split(","))
        return {"sm_mhz": sm, "mem_mhz": mem, "max_sm_mhz": max_sm}
    except Exception:
        return {}


def quantiles(values) -> dict:
    """A result row's {"p20", "p50", "p80", "n"} of any values (times in any unit): timing.Measurement's."""
    return Measurement(values).quantiles()


def time_each_call(owner, name: str, bucket, key: str | None = None):
    """Wrap owner.name so that each call's host time (s) is appended to bucket[key or name]; returns the original
    (to put back with setattr)."""
    original = getattr(owner, name)
    key = key or name

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            bucket[key].append(time.perf_counter() - t)

    setattr(owner, name, wrapper)
    return original


def bootstrap_ci90(statistic, n: int, resamples: int = 2000) -> list:
    """[5th, 95th] percentile of statistic(picks) over `resamples` resamplings with replacement of n paired
    observations (seeded): picks is a (resamples, n) array of indices, and statistic returns one value per row."""
    picks = np.random.default_rng(0).integers(0, n, size=(resamples, n))
    values = statistic(picks)
    return [float(np.percentile(values, 5)), float(np.percentile(values, 95))]


def command_line() -> str:
    """The command that is running, with CUDA_VISIBLE_DEVICES when set (it says which GPU --device 0 was)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    prefix = f"CUDA_VISIBLE_DEVICES={shlex.quote(visible)} " if visible is not None else ""
    return prefix + "python " + " ".join(shlex.quote(a) for a in sys.argv)


def gpu_parser(doc: str, reps: int) -> argparse.ArgumentParser:
    """The arguments every GPU benchmark takes: --device, --reps, --out (add your own to the parser)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--out", required=True)
    return p


@contextmanager
def private_cache(name: str):
    """A calibration cache of this block's own (TORCH_L2TOPO_CACHE), removed at its end with the variable restored:
    no cached map of another run is used, and none is left behind."""
    previous = os.environ.get("TORCH_L2TOPO_CACHE")
    with tempfile.TemporaryDirectory(prefix=f"l2topo-{name}-") as cache:
        os.environ["TORCH_L2TOPO_CACHE"] = cache
        try:
            yield Path(cache)
        finally:
            if previous is None:
                os.environ.pop("TORCH_L2TOPO_CACHE")
            else:
                os.environ["TORCH_L2TOPO_CACHE"] = previous


def calibrated_device(index: int, name: str):
    """(torch.device, its calibration, {"uuid_hash", "trust"} for the figures): device `index` made current
    and calibrated into a private cache (so that no cached map of another run is reused)."""
    os.environ.setdefault("TORCH_L2TOPO_CACHE", tempfile.mkdtemp(prefix=f"l2topo-{name}-"))
    import torch

    import torch_l2topo

    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    topo = torch_l2topo.calibrate(dev)
    return dev, topo, {"uuid_hash": topo.meta["uuid_hash"], "trust": topo.meta.get("trust", {}).get("trusted")}


COMMIT_ENV = "L2TOPO_COMMIT"  # the commit a copied tree was made from (the device machine's copy has no history)


def git_commit() -> str | None:
    """The commit the results are of: $L2TOPO_COMMIT where set (a copy of the tree), else the short hash of the
    checkout's HEAD, else None."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def write_result(path, figures: dict, device_index: int = 0, benchmark: str | None = None,
                 rows: list | None = None) -> Path:
    """A GPU benchmark's result file: figures with the GPU's environment and the command; with `rows`, those
    rows are appended to the benchmark's table as well (append_rows)."""
    return write_json(path, figures, environment(device_index), benchmark, rows)


def write_json(path, figures: dict, env: dict, benchmark: str | None = None, rows: list | None = None) -> Path:
    """The result file {"command", "commit", "env", "figures"} at path; with `rows`, the rows appended to
    the table of `benchmark` with that header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command_line(), "commit": git_commit(), "env": env, "figures": figures}
    path.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    if rows is not None:
        append_rows(benchmark, rows, env, doc["command"], doc["commit"])
    return path


def row(case: str, metric: str, unit: str, measured) -> dict:
    """One row of a table, before append_rows adds the header: `measured` is a quantiles dict ({"p20", "p50",
    "p80"[, "n"]}, as quantiles() gives) or one number (a scalar metric: a ratio, a count, a single time; a
    bool becomes 1 or 0)."""
    if isinstance(measured, dict):
        return {"case": case, "metric": metric, "unit": unit, **{k: _plain(measured[k]) for k in (*QUANTILES, "n")
                                                                if k in measured}}
    return {"case": case, "metric": metric, "unit": unit, "value": _plain(measured)}


def _plain(v):
    """A Python number for a numpy scalar or a bool (JSON and the checks below see plain numbers)."""
    v = v.item() if isinstance(v, np.generic) else v
    return int(v) if isinstance(v, bool) else v


def quantile_rows(tree, case: str, unit: str) -> list:
    """A row (metric: its key) for each quantiles dict directly under `tree`; other entries are left out."""
    return [row(case, str(k), unit, v) for k, v in tree.items() if isinstance(v, dict) and set(QUANTILES) <= set(v)]


def case_rows(items, describe, unit: str, measured: str = "impl", ratios=()) -> list:
    """Rows of a benchmark's list of cases (dicts): one per quantiles dict under item[measured] (metric: its key,
    in `unit`) and one per key of `ratios` the item has (a ratio: unit "x"), all with case describe(item)."""
    rows = []
    for item in items:
        case = describe(item)
        rows += quantile_rows(item.get(measured, {}), case, unit)
        rows += [row(case, k, "x", item[k]) for k in ratios if item.get(k) is not None]
    return rows


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def check_row(r: dict) -> None:
    """ValueError naming what is wrong with a complete table row: a field missing, unknown or empty, quantiles
    out of order, or both (or neither of) quantiles and a value."""
    missing = [k for k in ROW_FIELDS if k not in r]
    if missing:
        raise ValueError(f"table row {r.get('case')!r}/{r.get('metric')!r} lacks {', '.join(missing)}")
    unknown = set(r) - {*ROW_FIELDS, *QUANTILES, "n", "value"}
    if unknown:
        raise ValueError(f"table row {r['case']!r}/{r['metric']!r} has unknown fields {sorted(unknown)}")
    for k in ("benchmark", "case", "metric", "unit", "gpu", "date", "command"):
        if not isinstance(r[k], str) or not r[k]:
            raise ValueError(f"table row {r['case']!r}/{r['metric']!r}: {k} must be a non-empty string, got {r[k]!r}")
    spread = [k for k in QUANTILES if k in r]
    if ("value" in r) == bool(spread) or spread not in ([], list(QUANTILES)):
        raise ValueError(f"table row {r['case']!r}/{r['metric']!r} needs p20, p50 and p80, or a value (not both)")
    numbers = [r[k] for k in spread] or [r["value"]]
    if not all(map(_number, numbers)):
        raise ValueError(f"table row {r['case']!r}/{r['metric']!r}: not finite numbers: {numbers}")
    if spread and not r["p20"] <= r["p50"] <= r["p80"]:
        raise ValueError(f"table row {r['case']!r}/{r['metric']!r}: p20 <= p50 <= p80 fails: {numbers}")


def table_path(benchmark: str, table_dir=RESULTS) -> Path:
    return Path(table_dir) / f"{benchmark}.jsonl"


def append_rows(benchmark: str, rows: list, env: dict, command: str, commit: str | None = None,
                table_dir=RESULTS) -> int:
    """Append rows (row()'s) to the table benchmarks/results/<benchmark>.jsonl with the run's header: the GPU
    model ("cpu" for a CPU-only run), its uuid hash, the commit, the date and the command. Rows already in the
    table (the same case, metric, device, date and command: the same run tabulated twice) are skipped; nothing is
    ever rewritten. Every row is checked before any is written. Returns the number of rows appended."""
    if not isinstance(benchmark, str) or not benchmark.isidentifier():
        raise ValueError(f"benchmark must name a table (letters, digits, _), got {benchmark!r}")
    header = {"benchmark": benchmark, "gpu": env.get("gpu") or "cpu", "device_hash": env.get("uuid_hash"),
              "commit": commit, "date": env.get("date"), "command": command}
    full = [{**r, **header} for r in rows]
    for r in full:
        check_row(r)
    path = table_path(benchmark, table_dir)
    key = lambda r: (r["case"], r["metric"], r["device_hash"], r["date"], r["command"])  # noqa: E731
    seen = {key(json.loads(line)) for line in path.read_text().splitlines()} if path.exists() else set()
    new = [r for r in full if key(r) not in seen]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in new:
            f.write(json.dumps({k: r[k] for k in (*ROW_FIELDS, *QUANTILES, "n", "value") if k in r},
                               default=json_default) + "\n")
    return len(new)

