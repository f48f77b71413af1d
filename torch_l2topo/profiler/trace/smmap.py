"""What a trace carries of a calibration: per SM its L2 partition, chain latency and clock, plus the device and
where the calibration came from. The one form the profiler works from: built from a Topology, written into
the trace's metadata, and read back from an enriched trace (trace-summary, the timeline figure).

Identifiers: the device's uuid and board serial stay out unless the caller opts in (include_ids); the
hashed ids (uuid_hash, serial_hash) are always kept: they match a trace to a calibration without exposing
the machine.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
from dataclasses import dataclass, field, fields

import numpy as np

from ...analysis.labels import sm_labels

# Device fields copied into the trace; "uuid" only with include_ids (the rest identify a model, not a board).
DEVICE_FIELDS = ("name", "cc", "sm_count", "l2_bytes", "driver", "mig")
SLOW_FRACTION = 0.1  # "the slowest decile": the SMs with the highest chain latency, a tenth of them


@dataclass(frozen=True)
class SmMap:
    """Per-SM arrays (index = %smid): partition (0/1, -1 undecided), chain_cycles (cycles per dependent L2
    load), sm_clock_ghz; device: the device fields; ids: uuid_hash and serial_hash (plus uuid and serial when
    opted in); trust: the calibration's self-check verdict (None: not recorded); measured: its date; source:
    where it came from."""

    partition: np.ndarray
    chain_cycles: np.ndarray
    sm_clock_ghz: np.ndarray
    device: dict = field(default_factory=dict)
    ids: dict = field(default_factory=dict)
    trust: dict | None = None
    measured: str | None = None
    source: str | None = None

    def __post_init__(self):
        part = np.asarray(self.partition, dtype=np.int64)
        chain = np.asarray(self.chain_cycles, dtype=np.float64)
        clock = np.asarray(self.sm_clock_ghz, dtype=np.float64)
        if part.ndim != 1 or chain.shape != part.shape or clock.shape != part.shape or part.size == 0:
            raise ValueError(f"partition, chain_cycles and sm_clock_ghz must be 1-D of one length >= 1, got "
                             f"{part.shape}, {chain.shape}, {clock.shape}")
        if not np.isin(part, (-1, 0, 1)).all():
            raise ValueError("partition values must be 0, 1 or -1 (undecided)")
        if not (np.isfinite(chain).all() and np.isfinite(clock).all() and (clock > 0).all()):
            raise ValueError("chain_cycles and sm_clock_ghz must be finite (and clocks > 0)")
        for name, a in (("partition", part), ("chain_cycles", chain), ("sm_clock_ghz", clock)):
            object.__setattr__(self, name, a)

    def __reduce__(self):
        # a background trace handler sends its maps with every cycle's job (worker.py): the fields are pickled
        # once per map (maps are not changed after they are made)
        blob = self.__dict__.get("_pickled")
        if blob is None:
            blob = pickle.dumps(tuple(getattr(self, f.name) for f in fields(self)), protocol=pickle.HIGHEST_PROTOCOL)
            object.__setattr__(self, "_pickled", blob)
        return _unpickle, (blob,)

    @property
    def n_sm(self) -> int:
        return len(self.partition)

    @classmethod
    def from_topology(cls, topo, include_ids: bool = False) -> SmMap:
        m = topo.meta
        dev = m.get("device", {})
        device = {k: dev[k] for k in DEVICE_FIELDS if k in dev}
        device.setdefault("sm_count", topo.n_sm)
        ids = {k: m[k] for k in ("uuid_hash", "serial_hash") if m.get(k)}
        if include_ids:
            ids.update({k: v for k, v in (("uuid", dev.get("uuid")), ("serial", m.get("serial"))) if v})
        return cls(partition=sm_labels(topo).partition, chain_cycles=topo.chain_cycles,
                   sm_clock_ghz=topo.sm_clock_ghz, device=device, ids=ids, trust=m.get("trust"),
                   measured=m.get("date"), source=m.get("source"))

    def to_json(self) -> dict:
        # full precision: a map read back from a trace orders its SMs exactly as the one that wrote it
        return {"device": self.device, "ids": self.ids, "trust": self.trust, "measured": self.measured,
                "source": self.source, "partition": self.partition.tolist(),
                "chain_cycles": self.chain_cycles.tolist(), "sm_clock_ghz": self.sm_clock_ghz.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> SmMap:
        """The map to_json() wrote; TypeError or ValueError (KeyError for a missing array) naming the field of
        anything else: arrays that are not lists of numbers (partition: integers), non-object device facts."""
        if not isinstance(d, dict):
            raise TypeError(f"a calibration is a JSON object, not {type(d).__name__}")
        for key, kinds in (("partition", "iu"), ("chain_cycles", "fiu"), ("sm_clock_ghz", "fiu")):
            if np.asarray(d[key]).dtype.kind not in kinds:
                raise TypeError(f"{key} must be a list of {'integers' if kinds == 'iu' else 'numbers'}")
        for key, kind, wanted in (("device", dict, "an object"), ("ids", dict, "an object"),
                                  ("trust", (dict, type(None)), "an object or null"),
                                  ("measured", (str, type(None)), "a string or null"),
                                  ("source", (str, type(None)), "a string or null")):
            if key in d and not isinstance(d[key], kind):
                raise TypeError(f"{key} is {type(d[key]).__name__}, not {wanted}")
        return cls(partition=d["partition"], chain_cycles=d["chain_cycles"], sm_clock_ghz=d["sm_clock_ghz"],
                   device=d.get("device", {}), ids=d.get("ids", {}), trust=d.get("trust"),
                   measured=d.get("measured"), source=d.get("source"))

    def order(self) -> np.ndarray:
        """SM ids by partition (0, 1, then undecided) and, within one, by chain latency (fastest first)."""
        part_key = np.where(self.partition < 0, 2, self.partition)
        return np.lexsort((np.arange(self.n_sm), self.chain_cycles, part_key))

    def track_name(self, sm: int) -> str:
        """"SM 43 · p1 · 297.1 cyc" ("p?" for an undecided partition)."""
        p = self.partition[sm]
        return f"SM {sm} · p{p if p >= 0 else '?'} · {self.chain_cycles[sm]:.1f} cyc"

    def slowest(self, fraction: float = SLOW_FRACTION) -> np.ndarray:
        """The ceil(fraction x n_sm) SMs with the highest chain latency (ties: lower SM id first)."""
        k = int(np.ceil(fraction * self.n_sm))
        return np.sort(np.lexsort((np.arange(self.n_sm), -self.chain_cycles))[:k])


# The maps made so far in this process, so that a profiler block does not redo a calibration's analysis that an
# earlier block did: sm_labels' linear algebra costs milliseconds and leaves numpy's BLAS threads (one per core)
# spinning for a while next to the training loop. Keys: a calibration's content, or a cache file as last written.
_MADE: dict = {}


def map_of(topo, include_ids: bool = False) -> SmMap:
    """SmMap.from_topology(topo, include_ids), made once per calibration content in this process."""
    digest = hashlib.blake2b(digest_size=16)
    for a in (topo.line_cycles, topo.line_noise, topo.chain_cycles, topo.sm_clock_ghz,
              topo.extras.get("gpc_truth", np.zeros(0))):
        digest.update(np.ascontiguousarray(a).tobytes())
    digest.update(json.dumps([topo.meta, topo.source], sort_keys=True, default=str).encode())
    key = ("content", digest.hexdigest(), include_ids)
    if key not in _MADE:
        _MADE[key] = SmMap.from_topology(topo, include_ids)
    return _MADE[key]


def map_of_file(path, include_ids: bool = False) -> SmMap:
    """The SmMap of the calibration saved at `path`, read once per version of the file in this process
    (TopologyFormatError or OSError if it cannot be read)."""
    from ...topology import Topology

    st = os.stat(path)
    key = ("file", os.fspath(path), st.st_mtime_ns, st.st_size, include_ids)
    if key not in _MADE:
        _MADE[key] = map_of(Topology.load(path), include_ids)
    return _MADE[key]


def _unpickle(blob: bytes) -> SmMap:
    return SmMap(*pickle.loads(blob))
