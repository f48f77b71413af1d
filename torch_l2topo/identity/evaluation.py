"""The fingerprint decision measured on a labelled collection of calibrations, many GPUs, sessions, machines.

Owns: reading a collection manifest (one row per calibration: file, hashed uuid and board serial, date,
session, machine, backend, mode), the trust screen of each calibration, the ground truth of a pair (the
board serial where both have one, else the uuid, and which was used), the fit of the decision band on a
tuning part and its false match / false non-match / ambiguous rates, with 95% Clopper-Pearson intervals,
on the held-out rest. benchmarks/bench_fingerprint.py runs it on the labelled collection; the
tests run it with recorded.py's split.

A manifest row may also name raw repeats inside a benchmark's .npz (`member`: the key prefix of
repeat_chain_cycles etc., as bench_noise.py and bench_trust.py write them): those carry a chain map but no
line matrix, so they have no signature (no partition sides) and enter only the chain-map comparison.
"""
from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..measure import trust
from ..measure.probes import wave_size
from ..measure.repeats import Repeats, combine
from ..topology import Topology
from .fingerprint import AMBIGUOUS, MATCH, NO_MATCH, DeviceSignature, calibrate_threshold, decide, distance, signature

COLUMNS = ("file", "member", "uuid_hash", "serial_hash", "date", "session", "machine", "gpu_index", "backend",
           "mode", "source")


@dataclass(frozen=True, eq=False)
class Record:
    """One calibration of the collection. chain: its chain map minus the median (cycles). signature: None for
    raw repeats (no line matrix). trusted/problems: the trust screen (screen())."""

    key: str
    row: dict
    chain: np.ndarray
    signature: DeviceSignature | None
    trusted: bool
    problems: tuple = field(default_factory=tuple)

    @property
    def uuid_hash(self) -> str:
        return self.row["uuid_hash"]

    @property
    def serial_hash(self) -> str | None:
        return self.row.get("serial_hash") or None

    @property
    def session(self) -> str:
        return self.row["session"]


def read_manifest(path) -> list[dict]:
    """The rows of a manifest CSV (COLUMNS), in file order; raises ValueError naming a missing column."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows, start=2):
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise ValueError(f"{path}:{i} lacks columns {missing}")
    return rows


def write_manifest(path, rows) -> Path:
    """Write rows (dicts with COLUMNS) as a manifest CSV, sorted by session, file and member."""
    path = Path(path)
    rows = sorted(rows, key=lambda r: (r["session"], r["file"], r["member"]))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows({c: r.get(c, "") for c in COLUMNS} for r in rows)
    return path


def load_collection(manifest, root) -> list[Record]:
    """Every row of `manifest` as a Record; `root`: the directory the rows' file paths are relative to."""
    records, arrays = [], {}
    for row in read_manifest(manifest):
        path = Path(root) / row["file"]
        key = Path(row["file"]).stem + (f":{row['member']}" if row["member"] else "")
        if not row["member"]:
            topo = Topology.load(path)
            ok, problems = screen(topo)
            chain = topo.chain_cycles.astype(np.float64)
            records.append(Record(key, row, chain - np.median(chain), signature(topo), ok, problems))
            continue
        if path not in arrays:
            with np.load(path, allow_pickle=False) as z:
                arrays[path] = {k: z[k] for k in z.files}
        reps = Repeats.from_extras({k[len(row["member"]) + 1:]: v for k, v in arrays[path].items()
                                    if k.startswith(row["member"] + "_")})
        if reps is None:
            raise ValueError(f"{path} holds no repeats under {row['member']!r}")
        verdict = trust.check(reps)
        chain = combine(reps.chain_cycles, wave_size(row["mode"] or "waves", reps.chain_cycles.shape[1]))
        records.append(Record(key, row, chain - np.median(chain), None, verdict.trusted, verdict.problems))
    return records


def screen(topo: Topology) -> tuple[bool, tuple]:
    """(trusted, problems) of a saved calibration: trust.check() on its raw repeats where it kept them, else
    its recorded verdict, else trust's thresholds applied to what the saved maps still show (the repeat range
    per SM, the SM clock spread, the chain against the SM's median line latency)."""
    reps = Repeats.from_extras(topo.extras)
    if reps is not None:
        v = trust.check(reps)
        return v.trusted, v.problems
    if "trust" in topo.meta:
        return bool(topo.meta["trust"]["trusted"]), tuple(topo.meta["trust"].get("problems", ()))
    problems = []
    if topo.chain_noise.max() > trust.REPEAT_PTP_MAX:
        problems.append(f"repeat range {topo.chain_noise.max():.2f} cycles > {trust.REPEAT_PTP_MAX}")
    spread = float(np.ptp(topo.sm_clock_ghz) / np.median(topo.sm_clock_ghz))
    if spread > trust.CLOCK_SPREAD_MAX:
        problems.append(f"SM clock spread {spread:.4f} > {trust.CLOCK_SPREAD_MAX}")
    ratio = float(np.max(topo.chain_cycles / np.median(topo.line_cycles, axis=1)))
    if ratio > trust.RESIDENT_RATIO_MAX:
        problems.append(f"chain / line latency {ratio:.2f} > {trust.RESIDENT_RATIO_MAX}: ring not L2-resident")
    return not problems, tuple(problems)


def same_device(a: Record, b: Record) -> tuple[bool, str]:
    """(same physical GPU?, "serial" or "uuid": which identifier decided it)."""
    if a.serial_hash and b.serial_hash:
        return a.serial_hash == b.serial_hash, "serial"
    return a.uuid_hash == b.uuid_hash, "uuid"


def device_of(r: Record) -> str:
    """The device label of a record: 'serial:<hash>' where known, else 'uuid:<hash>'."""
    return f"serial:{r.serial_hash}" if r.serial_hash else f"uuid:{r.uuid_hash}"


def chain_rms(a: Record, b: Record) -> float:
    """RMS over SMs of the difference of two centered chain maps, its median removed (cycles)."""
    d = a.chain - b.chain
    return float(np.sqrt(np.mean((d - np.median(d)) ** 2)))


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    distance: float
    same: bool
    truth: str  # "serial" or "uuid"


def pairs(records, keep=lambda a, b: True) -> list[Pair]:
    """Signature distances of every pair of trusted records with signatures for which keep(a, b) holds."""
    usable = [r for r in records if r.trusted and r.signature is not None]
    return [Pair(a.key, b.key, distance(a.signature, b.signature), *same_device(a, b))
            for a, b in itertools.combinations(usable, 2) if keep(a, b)]


def fit(tuning_pairs) -> dict:
    """The decision band from tuning pairs: threshold and factor (calibrate_threshold()), with the data."""
    within = [p.distance for p in tuning_pairs if p.same]
    between = [p.distance for p in tuning_pairs if not p.same]
    threshold, factor = calibrate_threshold(within, between)
    return {"threshold": threshold, "factor": factor, "band": [threshold / factor, threshold * factor],
            "n_within": len(within), "n_between": len(between), "within_max": max(within),
            "between_min": min(between)}


def clopper_pearson(k: int, n: int, level: float = 0.95) -> list:
    """The exact (Clopper-Pearson) interval of a binomial rate k/n; [0, 1] when n is 0."""
    from scipy.stats import beta

    if n == 0:
        return [0.0, 1.0]
    alpha = 1 - level
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return [lo, hi]


def _rate(k: int, n: int) -> dict:
    return {"k": k, "n": n, "rate": k / n if n else None, "ci95": clopper_pearson(k, n)}


def evaluate(test_pairs, threshold: float, factor: float) -> dict:
    """Verdicts of held-out pairs (each one query against a one-entry registry) against the ground truth.

    false_match: different devices, verdict match. false_non_match: same device, verdict no match.
    ambiguous_*: the verdict was ambiguous. serial_collisions: false matches where both serials are known.
    Rates over calibration pairs (which are not independent: many pairs share a GPU, so the intervals are
    optimistic), and false matches also over device pairs.
    """
    verdicts = [(p, decide(p.distance, math.inf, threshold, factor)) for p in test_pairs]
    same = [(p, v) for p, v in verdicts if p.same]
    diff = [(p, v) for p, v in verdicts if not p.same]
    out = {"threshold": threshold, "factor": factor,
           "false_match": _rate(sum(v == MATCH for _, v in diff), len(diff)),
           "false_non_match": _rate(sum(v == NO_MATCH for _, v in same), len(same)),
           "ambiguous_same": _rate(sum(v == AMBIGUOUS for _, v in same), len(same)),
           "ambiguous_different": _rate(sum(v == AMBIGUOUS for _, v in diff), len(diff)),
           "truth_by": {t: sum(p.truth == t for p, _ in verdicts) for t in ("serial", "uuid")},
           # two different board serials whose maps matched: the collisions the map cannot tell apart
           "serial_collisions": _rate(sum(v == MATCH for p, v in diff if p.truth == "serial"),
                                      sum(p.truth == "serial" for p, _ in diff))}
    out["listed"] = [{"a": p.a, "b": p.b, "distance": p.distance, "same": p.same, "truth": p.truth, "verdict": v}
                     for p, v in verdicts if (v != MATCH) == p.same or v == AMBIGUOUS]
    return out


def device_pairs(records, test_pairs, threshold: float, factor: float) -> dict:
    """Different-device pairs counted once per pair of devices: how many the map matched or could not call
    (for any of their calibration pairs), and the distances; the unit is one pair of GPUs."""
    dev = {r.key: device_of(r) for r in records}
    by = {}
    for p in test_pairs:
        if not p.same:
            by.setdefault(tuple(sorted((dev[p.a], dev[p.b]))), []).append(p.distance)
    verdicts = {k: decide(min(v), math.inf, threshold, factor) for k, v in by.items()}
    return {"n": len(by), "matched": _rate(sum(v == MATCH for v in verdicts.values()), len(by)),
            "ambiguous": _rate(sum(v == AMBIGUOUS for v in verdicts.values()), len(by)),
            "not_separated": [{"devices": list(k), "min_distance": min(by[k]), "verdict": v}
                              for k, v in sorted(verdicts.items()) if v != NO_MATCH]}
