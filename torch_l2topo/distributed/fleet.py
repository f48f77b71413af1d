"""The fleet table: one row per rank of a job, built from what every rank reported (pure numpy and pandas).

Owns what one rank reports about its calibration (describe(): device, hashed identity, clock, latency
summary, partition layout, self-check verdict, the map-moved figures of its last calibration), and Fleet:
the table of all ranks, their pairwise fingerprint distances (identity/fingerprint.py's distance, for all
pairs at once) and the findings of health.py. gather.py collects the reports across a torch.distributed
job; everything here runs on recorded calibrations without a GPU or a process group.

Raw identifiers (the GPU uuid, the host name) stay out of the reports unless the caller opts in
(identifiers=True): the table carries sha256 hashes, as result files do (device.uuid_hash).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from ..analysis.labels import sm_labels
from ..files import json_default
from ..identity.fingerprint import AMBIGUITY_FACTOR, BLOCKS, DEFAULT_THRESHOLD, SIGNATURE_VERSION, signature
from ..topology import Topology

# The table's columns, in order (uuid and a raw host name only with identifiers=True).
COLUMNS = ("rank", "local_rank", "host", "device_index", "device", "sm_count", "cc", "uuid_hash", "serial_hash",
           "uuid", "driver", "backend", "mode", "date", "trusted", "clock_ghz", "chain_median_cycles",
           "chain_spread_cycles", "chain_median_ns", "layout", "gap_cycles", "previous_shift_cycles",
           "previous_clock_ghz", "calibrate_s", "error", "nearest_rank", "nearest_distance", "findings")


def describe(topo: Topology, identifiers: bool = False) -> tuple[dict, np.ndarray]:
    """(what a rank reports about its calibration, its fingerprint signature vector).

    The report holds the device model and hashed identity, the probing clock, the chain latency summary
    (median, max - min over SMs, median in ns), the L2 partition layout (SMs per partition, smaller first:
    "64+68"; "none" when no partition was found) with the near - far gap, the self-check verdict, and the
    figures of the map-moved check made when it was measured (trust.py: the median shift of the chain map
    and the clock of the GPU's previous calibration; None when there was none). Raises ValueError for a
    calibration without device metadata.
    """
    sig = signature(topo)  # checks the device metadata
    meta, dev = topo.meta, topo.meta["device"]
    labels = sm_labels(topo)
    parts = labels.partitions
    if parts.found:
        layout = "+".join(str(n) for n in sorted(parts.sm_counts))
        undecided = topo.n_sm - sum(parts.sm_counts)
        layout += f" ({undecided} undecided)" if undecided else ""
    else:
        layout = "none"
    trust = meta.get("trust") or {}
    figures = trust.get("figures") or {}
    report = {
        "device": str(dev["name"]), "sm_count": topo.n_sm, "cc": ".".join(str(x) for x in dev["cc"]),
        "uuid_hash": meta.get("uuid_hash"), "serial_hash": meta.get("serial_hash"),
        "uuid": str(dev.get("uuid")) if identifiers else None, "driver": dev.get("driver"),
        "backend": meta.get("backend"), "mode": meta.get("mode"), "date": meta.get("date"),
        "trusted": bool(trust.get("trusted", True)), "clock_ghz": float(np.median(topo.sm_clock_ghz)),
        "chain_median_cycles": float(np.median(topo.chain_cycles)),
        "chain_spread_cycles": float(np.ptp(topo.chain_cycles)), "chain_median_ns": float(np.median(topo.chain_ns)),
        "layout": layout, "gap_cycles": float(labels.gap_cycles) if parts.found else None,
        "previous_shift_cycles": figures.get("previous_shift_cycles"),
        "previous_clock_ghz": figures.get("previous_clock_ghz"),
        "signature_version": sig.version, "signature_length": int(sig.vector.size),
    }
    return report, sig.vector


def model_key(record: dict) -> tuple | None:
    """What must be equal for two ranks' signatures to be compared: model, SM count, cc, signature version and
    length (fingerprint.distance refuses anything else). None for a rank without a signature."""
    if not record.get("signature_length"):
        return None
    return (record.get("device"), record.get("sm_count"), record.get("cc"), record.get("signature_version"),
            record.get("signature_length"))


def pairwise_distances(vectors, sm_count: int) -> np.ndarray:
    """fingerprint.distance() of every pair of signature vectors of one model, as a symmetric matrix.

    The same formula (per block: the difference minus its median, RMS over all entries), evaluated one row
    against all later rows at a time: at 1,000 GPUs (half a million pairs) a loop over distance() took an
    estimated 99 s on a shared 2-core machine, this 5 s (benchmarks/bench_fleet.py paper).
    """
    v = np.asarray(vectors, dtype=np.float64)
    n = len(v)
    if v.ndim != 2 or v.shape[1] != len(BLOCKS) * sm_count:
        raise ValueError(f"expected signature vectors of length {len(BLOCKS) * sm_count}, got shape {v.shape}")
    out = np.zeros((n, n))
    blocks = [v[:, b * sm_count:(b + 1) * sm_count] for b in range(len(BLOCKS))]
    for i in range(n - 1):
        total = np.zeros(n - i - 1)
        for block in blocks:
            d = block[i] - block[i + 1:]
            d -= np.median(d, axis=1, keepdims=True)
            total += np.einsum("ij,ij->i", d, d)
        out[i, i + 1:] = out[i + 1:, i] = np.sqrt(total / v.shape[1])
    return out


@dataclass
class Fleet:
    """The fleet of a job: `table` (pandas, one row per rank, COLUMNS), `distances` (pandas, rank x rank
    fingerprint distances in cycles; NaN where two ranks cannot be compared: another model, or no calibration)
    and `findings` (health.Finding: failed calibrations, ranks on one GPU, mixed models, moved maps, GPUs
    deviating from their peers). health_lines() writes the findings as DCGM-style diagnostic lines."""

    table: object
    distances: object
    findings: list

    @classmethod
    def from_records(cls, records, vectors) -> "Fleet":
        """The fleet of the ranks' reports (records: gather.local_record()'s dicts with "rank") and their
        signature vectors (None for a rank without one), in rank order."""
        import pandas as pd

        from .health import findings_of

        records = [dict(r) for r in records]
        if len(records) != len(vectors):
            raise ValueError(f"{len(records)} records but {len(vectors)} signature vectors")
        ranks = [r["rank"] for r in records]
        n = len(records)
        dist = np.full((n, n), np.nan)
        groups: dict = {}
        for i, (record, vector) in enumerate(zip(records, vectors)):
            key = model_key(record)
            if key is not None and vector is not None:
                groups.setdefault(key, []).append(i)
        for key, members in groups.items():
            sub = pairwise_distances([vectors[i] for i in members], key[1])
            dist[np.ix_(members, members)] = sub
        others = np.where(np.eye(n, dtype=bool) | np.isnan(dist), np.inf, dist)
        nearest = others.argmin(axis=1) if n else []
        for i, record in enumerate(records):
            found = n > 1 and np.isfinite(others[i, nearest[i]])
            record["nearest_rank"] = ranks[nearest[i]] if found else None
            record["nearest_distance"] = float(others[i, nearest[i]]) if found else None
        table = pd.DataFrame([{c: r.get(c) for c in COLUMNS} for r in records], columns=list(COLUMNS))
        if not table["uuid"].notna().any():  # raw identifiers were not asked for: no empty column either
            table = table.drop(columns="uuid")
        distances = pd.DataFrame(dist, index=pd.Index(ranks, name="rank"), columns=pd.Index(ranks, name="rank"))
        findings = findings_of(table)
        checks: dict = {}
        for f in findings:
            checks.setdefault(f.rank, set()).add(f.check)
        table["findings"] = [", ".join(sorted(checks.get(rank, ()))) for rank in ranks]
        return cls(table, distances, findings)

    @property
    def verdict(self) -> str:
        """The health verdict: "Fail", "Warn" or "Pass" (the first of the health lines)."""
        from .health import verdict

        return verdict(self.findings)

    def health_lines(self) -> list:
        """The findings as DCGM-style diagnostic lines: an overall verdict, then one line per rank."""
        from .health import diagnostic_lines

        return diagnostic_lines(self.table, self.findings)

    def summary(self) -> str:
        """The table's main columns, the fingerprint distances and the health lines, as text."""
        import pandas as pd

        shown = [c for c in ("rank", "host", "device_index", "device", "uuid_hash", "clock_ghz", "chain_median_cycles",
                             "chain_spread_cycles", "layout", "gap_cycles", "calibrate_s", "nearest_rank",
                             "nearest_distance", "error") if c in self.table]
        with pd.option_context("display.width", 200, "display.max_columns", 30, "display.precision", 2):
            parts = [self.table[shown].to_string(index=False)]
            if len(self.distances) > 1:
                parts.append(f"fingerprint distances (cycles; fingerprint.decide: a match below "
                             f"{DEFAULT_THRESHOLD / AMBIGUITY_FACTOR:.2f}, none above "
                             f"{DEFAULT_THRESHOLD * AMBIGUITY_FACTOR:.2f}):\n"
                             + self.distances.round(2).to_string())
        return "\n\n".join(parts + ["\n".join(self.health_lines())])

    def to_dict(self) -> dict:
        """A JSON-ready form: the table's rows, the distance matrix (None where not comparable), the findings."""
        rows = json.loads(self.table.to_json(orient="records"))
        dist = [[None if not math.isfinite(x) else float(x) for x in row] for row in self.distances.to_numpy()]
        return {"signature_version": SIGNATURE_VERSION, "table": rows, "ranks": list(map(int, self.distances.index)),
                "distances": dist, "findings": [f.to_dict() for f in self.findings],
                "health": self.health_lines()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=json_default)
