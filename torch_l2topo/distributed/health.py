"""The health view of a fleet: what an operator should look at, with by how much, as DCGM-style lines.

Owns the findings on a fleet table (fleet.py) and their Pass / Warn / Fail lines (worded as `dcgmi diag` does):
Fail "calibration" (the rank's calibration failed or timed out); Warn "untrusted" (returned despite failed
self-checks); Warn "same GPU" (ranks sharing one uuid: a missing torch.cuda.set_device; judged by uuid, not by
maps, since different boards can have matching fingerprints); Warn "mixed models" (job-wide); Warn "map moved" /
"clock moved" (trust.py's check against the GPU's previous calibration); Warn "peers" (a map summary farther
than PEER_LIMITS from the median of its peer group: one model, partition layout and probe backend).
PEER_LIMITS: three times the largest deviation of a healthy GPU in the labelled collection, rounded up to 0.5,
tested on other boards and planted deviations (docs/fleet.md; benchmarks/bench_fleet.py recomputes them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..measure import trust

PASS, WARN, FAIL = "Pass", "Warn", "Fail"

# metric -> (what it is, unit, limit): the largest healthy deviations on the tuning sessions were 0.80 cycles
# (chain median), 0.84 (chain max - min), 0.66 (partition gap) and 0.33 ns (chain median in ns); on the held-out
# sessions 1.05, 1.06, 0.43 and 0.50 (benchmarks/bench_fleet.py paper, "peer_limits").
PEER_LIMITS = {
    "chain_median_cycles": ("chain latency", "cycles", 2.5),
    "chain_spread_cycles": ("chain max - min over SMs", "cycles", 3.0),
    "gap_cycles": ("near - far partition gap", "cycles", 2.0),
    "chain_median_ns": ("chain latency", "ns", 1.0),
}
# GPUs of a group, itself included, for the check to run: the median of three is one of them even when one is off,
# while between two a difference does not say which GPU is off
MIN_GROUP = 3
PEER_GROUP = ("device", "sm_count", "cc", "layout", "backend")


@dataclass(frozen=True)
class Finding:
    """One thing found: `rank` (None: the whole job), `level` (WARN or FAIL), `check` (module docstring), the
    `message` saying what and by how much, and `amount` (the number behind it, in the message's unit)."""

    rank: int | None
    level: str
    check: str
    message: str
    amount: float | None = None

    def to_dict(self) -> dict:
        return {"rank": self.rank, "level": self.level, "check": self.check, "message": self.message,
                "amount": self.amount}


def findings_of(table) -> list:
    """Every finding on a fleet table (fleet.Fleet.from_records calls this)."""
    rows = table.to_dict("records")
    out = []
    for row in rows:
        if _given(row.get("error")):
            out.append(Finding(row["rank"], FAIL, "calibration", str(row["error"])))
        elif _untrusted(row):
            out.append(Finding(row["rank"], WARN, "untrusted", "the map failed its self-checks (a busy GPU?) and "
                                                               "was used anyway"))
    ok = [r for r in rows if not _given(r.get("error"))]
    out += _same_gpu(rows) + _mixed_models(ok) + _moved(ok) + _peers(ok)
    return out


def _given(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _untrusted(row) -> bool:
    return _given(row.get("trusted")) and not bool(row["trusted"])


def _same_gpu(rows) -> list:
    by_uuid: dict = {}
    for r in rows:
        if _given(r.get("uuid_hash")):
            by_uuid.setdefault(r["uuid_hash"], []).append(r["rank"])
    out = []
    for uuid_hash, ranks in by_uuid.items():
        if len(ranks) > 1:
            text = ", ".join(map(str, ranks))
            out += [Finding(rank, WARN, "same GPU", f"ranks {text} run on one GPU (uuid-hash {uuid_hash}): give each "
                                                    f"rank its own (torch.cuda.set_device(LOCAL_RANK))")
                    for rank in ranks]
    return out


def _mixed_models(rows) -> list:
    counts: dict = {}
    for r in rows:
        if _given(r.get("device")):
            key = f"{r['device']} ({r['sm_count']} SMs)"
            counts[key] = counts.get(key, 0) + 1
    if len(counts) < 2:
        return []
    text = ", ".join(f"{n} x {key}" for key, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return [Finding(None, WARN, "mixed models", f"the job mixes GPU models: {text}; maps and fingerprints are "
                                                f"compared within a model only", float(len(counts)))]


def _moved(rows) -> list:
    out = []
    for r in rows:
        shift = r.get("previous_shift_cycles")
        if _given(shift) and abs(shift) > trust.PREVIOUS_SHIFT_NOTE:
            out.append(Finding(r["rank"], WARN, "map moved", f"its chain map moved by {shift:+.2f} cycles (median) "
                                                             f"since the GPU's previous calibration (limit "
                                                             f"{trust.PREVIOUS_SHIFT_NOTE:g})", float(shift)))
        old, now = r.get("previous_clock_ghz"), r.get("clock_ghz")
        if _given(old) and _given(now) and abs(now - old) > trust.CLOCK_SPREAD_MAX * old:
            out.append(Finding(r["rank"], WARN, "clock moved", f"it probed at {now:.3f} GHz, the GPU's previous "
                                                               f"calibration at {old:.3f} GHz ({now - old:+.3f})",
                               float(now - old)))
    return out


def _peers(rows) -> list:
    groups: dict = {}
    for r in rows:
        if not _untrusted(r) and all(_given(r.get(k)) for k in PEER_GROUP):
            groups.setdefault(tuple(r[k] for k in PEER_GROUP), []).append(r)
    out = []
    for key, members in groups.items():
        if len(members) < MIN_GROUP:
            continue
        for metric, (what, unit, limit) in PEER_LIMITS.items():
            values = [float(m[metric]) for m in members if _given(m.get(metric))]
            if len(values) < MIN_GROUP:
                continue
            median = float(np.median(values))
            for r in members:
                dev = float(r[metric]) - median if _given(r.get(metric)) else 0.0
                if abs(dev) > limit:
                    out.append(Finding(r["rank"], WARN, "peers", f"{what} {r[metric]:.2f} {unit}, {dev:+.2f} "
                                                                 f"({100 * dev / median:+.1f}%) from the median of its "
                                                                 f"{len(values)} peers ({key[0]}, layout {key[3]}, "
                                                                 f"{key[4]}; limit {limit:g})", dev))
    return out


def verdict(findings) -> str:
    """The fleet's overall verdict: Fail if any finding fails, else Warn if any warns, else Pass."""
    levels = [f.level for f in findings]
    return FAIL if FAIL in levels else WARN if WARN in levels else PASS


def diagnostic_lines(table, findings) -> list:
    """An overall line, one line per rank (Pass, or one line per finding), then the job-wide findings."""
    levels = [f.level for f in findings]
    overall = verdict(findings)
    hosts = table["host"].nunique() if "host" in table else 1
    lines = [f"L2 map health of {len(table)} rank(s) on {hosts} host(s): {overall} "
             f"({levels.count(FAIL)} fail, {levels.count(WARN)} warn)"]
    by_rank: dict = {}
    for f in findings:
        by_rank.setdefault(f.rank, []).append(f)
    for row in table.to_dict("records"):
        device = f"cuda:{int(row['device_index'])}" if _given(row.get("device_index")) else "no GPU"
        head = f"rank {row['rank']} {row.get('host') or '?'} {device} {row.get('device') or '?'} " \
               f"uuid-hash {row.get('uuid_hash') or '?'}"
        lines += [f"{head}: {f.level} - {f.check}: {f.message}" for f in by_rank.get(row["rank"], [])] or \
            [f"{head}: {PASS}"]
    lines += [f"job: {f.level} - {f.check}: {f.message}" for f in by_rank.get(None, [])]
    return lines
