"""Topology: one calibration of one GPU (per-SM arrays, the SM x line matrix, device metadata).

Saved as a compressed .npz of plain numeric arrays plus the metadata as UTF-8 JSON bytes, loaded with
allow_pickle=False: no pickle anywhere. A SHA-256 of the arrays is stored in the metadata, so a corrupt or
hand-edited file is detected on load rather than analysed.
"""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import TopologyFormatError
from .files import atomic_write, json_default

FORMAT_VERSION = 1
_META_KEY = "meta_json"
_PER_SM = ("chain_cycles", "chain_ns", "chain_noise", "line_noise", "sm_clock_ghz")
# A saved calibration is refused before anything is decompressed when its arrays would take more than this: the
# defaults (512 lines, 3 repeats kept in extras) take about 1 MiB, 256 MiB is 100,000 lines of a 132-SM GPU; a
# zip member can claim a thousand times its compressed size (a few KiB of zeros can unpack to a gigabyte).
MAX_LOAD_BYTES = 256 << 20
MAX_CLOCK_GHZ = 10.0  # no GPU clocks its SMs near this; a larger "clock" is a damaged or hand-made file
_POSITIVE = ("chain_cycles", "chain_ns", "line_cycles", "sm_clock_ghz")  # latencies and clocks
_NONNEGATIVE = ("chain_noise", "line_noise")  # spreads over the repeats
# Metadata fields other modules read, and their types (checked when present; None allowed where a field may be
# unknown). Device fields: what identity/, the report and the summary read of meta["device"].
_META_TYPES = {"device": dict, "config": dict, "versions": dict, "trust": (dict, type(None)), "date": str,
               "backend": str, "mode": str, "uuid_hash": (str, type(None)), "serial_hash": (str, type(None))}
_DEVICE_TYPES = {"name": str, "cc": list, "sm_count": int, "l2_bytes": int, "driver": (str, type(None)),
                 "uuid": (str, type(None)), "mig": bool}
# Per-SM columns that layers above this module add to to_frame("sm"): name -> function of the Topology.
# The package's __init__ registers "partition" (analysis/labels.py), which this root module may not import.
_SM_COLUMNS: dict[str, Callable] = {}


def register_sm_column(name: str, compute: Callable) -> None:
    """Add a per-SM column to every to_frame("sm"): compute(topology) returns an (n_sm,) array."""
    _SM_COLUMNS[name] = compute


@dataclass
class Topology:
    """A per-SM L2 latency map. Arrays are indexed by SM id (%smid) and, for lines, by probed line.

    chain_cycles/chain_ns: latency per dependent load over the random 2 MiB ring, per SM (median over
    the repeats of the mean over the ring). line_cycles: cycles per load, SM x line (median over repeats).
    line_addresses: virtual address of each probed line.
    chain_noise: per SM, max - min of chain_cycles over the repeats. line_noise: per SM, median over lines
    of max - min over the repeats. sm_clock_ghz: clock64 cycles / globaltimer ns while probing.
    extras: further named arrays recorded with the calibration by later probes (e.g. cluster ground truth).
    source: where this object was read from (a file path, a bundled example); set by load(), never saved, so a
    copy saved elsewhere names its own file.
    """

    chain_cycles: np.ndarray
    chain_ns: np.ndarray
    line_cycles: np.ndarray
    line_addresses: np.ndarray
    chain_noise: np.ndarray
    line_noise: np.ndarray
    sm_clock_ghz: np.ndarray
    meta: dict
    extras: dict = field(default_factory=dict)
    source: str | None = None

    def __post_init__(self):
        self.validate()

    def __repr__(self) -> str:
        """One line: device, SMs, backend and mode, date, chain min/median/max (summary() has the rest)."""
        m, c = self.meta, self.chain_cycles
        return (f"Topology({m.get('device', {}).get('name', '?')}, {self.n_sm} SMs, {m.get('backend', '?')}/"
                f"{m.get('mode', '?')}, measured {m.get('date', '?')}, chain min/median/max "
                f"{c.min():.1f}/{np.median(c):.1f}/{c.max():.1f} cycles"
                + (f", from {self.source})" if self.source else ")"))

    # ---- shape and sanity -------------------------------------------------------------------------
    @property
    def n_sm(self) -> int:
        return len(self.chain_cycles)

    @property
    def n_lines(self) -> int:
        return self.line_cycles.shape[1]

    def validate(self) -> None:
        """Raise TopologyFormatError naming the first array or metadata field that no calibration could hold:
        arrays of numbers of one SM count (>= 1) and line count (>= 1), positive finite latencies and clocks
        (clocks below MAX_CLOCK_GHZ), finite non-negative noise, and the metadata fields others read typed."""
        for name in (*_PER_SM, "line_cycles", "line_addresses"):
            arr, kinds = getattr(self, name), ("iu", "integers") if name == "line_addresses" else ("fiu", "numbers")
            if not isinstance(arr, np.ndarray) or arr.dtype.kind not in kinds[0]:
                raise TopologyFormatError(f"{name} must be an array of real {kinds[1]}, got "
                                          f"{getattr(arr, 'dtype', type(arr).__name__)}")
        if self.chain_cycles.ndim != 1:
            raise TopologyFormatError(f"chain_cycles must be 1-D (one value per SM), not {self.chain_cycles.shape}")
        n = self.n_sm
        for name in _PER_SM:
            if getattr(self, name).shape != (n,):
                raise TopologyFormatError(f"{name} must be an array of shape ({n},), got {getattr(self, name).shape}")
        if n < 1:
            raise TopologyFormatError("the arrays hold no SMs")
        if self.line_cycles.ndim != 2 or self.line_cycles.shape[0] != n or self.line_cycles.shape[1] < 1:
            raise TopologyFormatError(f"line_cycles must have shape ({n}, n_lines >= 1), got {self.line_cycles.shape}")
        if self.line_addresses.shape != (self.n_lines,) or (self.line_addresses < 0).any():
            raise TopologyFormatError(f"line_addresses must be {self.n_lines} addresses (>= 0)")
        for name in (*_POSITIVE, *_NONNEGATIVE):
            arr = getattr(self, name)
            if not np.all(np.isfinite(arr)):
                raise TopologyFormatError(f"{name} holds NaN or infinite values")
            if (arr <= 0).any() if name in _POSITIVE else (arr < 0).any():
                raise TopologyFormatError(f"{name} holds values {'<= 0' if name in _POSITIVE else '< 0'} (min "
                                          f"{arr.min():g}): not a latency, clock or spread a GPU can have")
        if self.sm_clock_ghz.max() > MAX_CLOCK_GHZ:
            raise TopologyFormatError(f"sm_clock_ghz reaches {self.sm_clock_ghz.max():g} GHz, over {MAX_CLOCK_GHZ:g}")
        for key, arr in self.extras.items():
            if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
                raise TopologyFormatError(f"extra array {key!r} must hold numbers, got "
                                          f"{getattr(arr, 'dtype', type(arr).__name__)}")
        _check_meta(self.meta, n)

    # ---- persistence -------------------------------------------------------------------------------
    def digest(self) -> str:
        """sha256 (hex) of what is saved: the arrays and the metadata. One digest, one calibration: what results
        derived from a calibration are cached under (a change to either array or metadata makes another digest)."""
        h = hashlib.sha256(_checksum(self._arrays()).encode())
        h.update(json.dumps(self.meta, sort_keys=True, default=json_default).encode())
        return h.hexdigest()

    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {name: getattr(self, name) for name in _PER_SM}
        arrays["line_cycles"] = self.line_cycles.astype(np.float32)
        arrays["line_addresses"] = self.line_addresses.astype(np.int64)
        arrays.update({f"extra_{k}": np.asarray(v) for k, v in self.extras.items()})
        return arrays

    def to_bytes(self) -> bytes:
        """The saved form (.npz of plain arrays + JSON metadata + checksum) as bytes: to send, no pickle."""
        arrays = self._arrays()
        meta = dict(self.meta, format_version=FORMAT_VERSION, checksum=_checksum(arrays))
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays, **{_META_KEY: np.frombuffer(json.dumps(meta).encode(), np.uint8)})
        return buf.getvalue()

    def save(self, path) -> Path:
        """Write atomically (temp file + rename in the same directory): readers never see half a file."""
        return atomic_write(Path(path), self.to_bytes())

    @classmethod
    def load(cls, path) -> "Topology":
        """Read a saved calibration; raise TopologyFormatError naming the file and what is wrong with a bad one."""
        path = Path(path)
        try:
            if path.stat().st_size > MAX_LOAD_BYTES:
                raise TopologyFormatError(f"{path} is {path.stat().st_size >> 20} MiB, more than a calibration "
                                          f"holds ({MAX_LOAD_BYTES >> 20} MiB at most)")
            data = path.read_bytes()
        except FileNotFoundError:
            raise
        except OSError as exc:  # a directory, no permission
            raise TopologyFormatError(f"{path} cannot be read: {exc.strerror or exc}") from None
        topo = cls.from_bytes(data, source=str(path))
        topo.source = str(path)
        return topo

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "calibration bytes") -> "Topology":
        """Inverse of to_bytes(); raise TopologyFormatError naming what is wrong (`source` names the input)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"from_bytes() takes bytes, got {type(data).__name__}")
        try:
            unpacked = sum(member.file_size for member in zipfile.ZipFile(io.BytesIO(data)).infolist())
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            unpacked = 0  # not a zip file: np.load says what it is below
        if unpacked > MAX_LOAD_BYTES:
            raise TopologyFormatError(f"{source} would unpack to {unpacked >> 20} MiB, more than a calibration holds "
                                      f"({MAX_LOAD_BYTES >> 20} MiB at most): refused before decompressing")
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError):
            # numpy's own message would advise allow_pickle=, which is unsafe and would not help
            raise TopologyFormatError(f"{source} is not a readable calibration (Topology.save writes an .npz of "
                                      f"plain numeric arrays; this is not one)") from None
        except Exception as exc:  # zlib.error and friends from a damaged member
            raise TopologyFormatError(f"{source} is damaged: {type(exc).__name__}: {exc}") from None
        if _META_KEY not in arrays:
            raise TopologyFormatError(f"{source} has no metadata")
        try:
            meta = json.loads(arrays.pop(_META_KEY).tobytes().decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TopologyFormatError(f"{source}: metadata is not valid JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise TopologyFormatError(f"{source}: metadata is a JSON {type(meta).__name__}, not an object")
        if meta.get("format_version") != FORMAT_VERSION:
            raise TopologyFormatError(f"{source} has format version {meta.get('format_version')}, this "
                                      f"torch_l2topo reads {FORMAT_VERSION}")
        if meta.pop("checksum", None) != _checksum(arrays):
            raise TopologyFormatError(f"{source}: checksum mismatch, the arrays were altered or damaged")
        meta.pop("format_version")
        missing = [k for k in (*_PER_SM, "line_cycles", "line_addresses") if k not in arrays]
        if missing:
            raise TopologyFormatError(f"{source} lacks arrays {missing}")
        extras = {k[len("extra_"):]: v for k, v in arrays.items() if k.startswith("extra_")}
        try:
            return cls(**{k: arrays[k] for k in (*_PER_SM, "line_cycles", "line_addresses")}, meta=meta,
                       extras=extras)
        except TopologyFormatError as exc:  # a valid checksum over arrays no calibration could hold
            raise TopologyFormatError(f"{source}: {exc}") from None

    def export_copy(self, **meta_updates) -> "Topology":
        """A copy fit to share: the device uuid replaced by its hash, the local cache key dropped."""
        meta = json.loads(json.dumps(self.meta))
        meta.pop("cache_key", None)
        if "device" in meta:
            meta["device"]["uuid"] = "sha256:" + meta.get("uuid_hash", "?")
        meta.update(meta_updates)
        return Topology(**{name: getattr(self, name).copy() for name in (*_PER_SM, "line_cycles", "line_addresses")},
                        meta=meta, extras={k: np.array(v) for k, v in self.extras.items()})

    # ---- views -------------------------------------------------------------------------------------
    def to_frame(self, kind: str = "sm"):
        """Tidy pandas views. kind="sm": one row per SM, with its L2 partition (0/1, -1 undecided: sm_labels).
        kind="lines": one row per (SM, line)."""
        import pandas as pd

        if kind == "sm":
            return pd.DataFrame({"sm": np.arange(self.n_sm), **{name: getattr(self, name) for name in _PER_SM},
                                 "line_mean_cycles": self.line_cycles.mean(axis=1),
                                 **{name: compute(self) for name, compute in _SM_COLUMNS.items()}})
        if kind == "lines":
            sm, line = np.meshgrid(np.arange(self.n_sm), np.arange(self.n_lines), indexing="ij")
            return pd.DataFrame({"sm": sm.ravel(), "line": line.ravel(),
                                 "address": np.broadcast_to(self.line_addresses, sm.shape).ravel(),
                                 "cycles": self.line_cycles.ravel()})
        raise ValueError(f"kind must be 'sm' or 'lines', got {kind!r}")

    def to_json(self) -> str:
        """A JSON view for people and scripts: the metadata, the per-SM maps and the per-line means (rounded).
        Not a save format: to_bytes() keeps everything."""
        return json.dumps({"meta": self.meta, "chain_cycles": np.round(self.chain_cycles, 3).tolist(),
                           "chain_ns": np.round(self.chain_ns, 3).tolist(),
                           "sm_clock_ghz": np.round(self.sm_clock_ghz, 4).tolist(),
                           "line_mean_cycles": np.round(self.line_cycles.mean(axis=0), 3).tolist()}, indent=1)

    def summary(self) -> str:
        """A one-screen text summary: device, provenance, and the spread of each map."""
        m = self.meta
        dev = m.get("device", {})
        c, lc = self.chain_cycles, self.line_cycles
        fastest, slowest = int(np.argmin(c)), int(np.argmax(c))
        line_means = lc.mean(axis=0)
        lines = [
            f"{dev.get('name', '?')}  cc {'.'.join(map(str, dev.get('cc', [])))}  {self.n_sm} SMs  "
            f"L2 {dev.get('l2_bytes', 0) / 2**20:.0f} MiB  driver {dev.get('driver', '?')}  "
            f"uuid-hash {m.get('uuid_hash', '?')}",
            f"measured {m.get('date', '?')}  backend {m.get('backend', '?')}  mode {m.get('mode', '?')}  "
            f"torch {m.get('versions', {}).get('torch', '?')}  triton {m.get('versions', {}).get('triton', '?')}",
            f"SM clock while probing: {np.median(self.sm_clock_ghz):.3f} GHz (median; "
            f"{self.sm_clock_ghz.min():.3f}-{self.sm_clock_ghz.max():.3f})",
            f"chain ({m.get('config', {}).get('chain_bytes', 0) // 1024} KiB random ring), cycles per load: "
            f"min {c.min():.2f} (SM {fastest})  mean {c.mean():.2f}  max {c.max():.2f} (SM {slowest})  "
            f"spread {100 * (c.max() - c.min()) / c.min():.1f}%",
            f"chain in ns per load: {self.chain_ns.min():.1f}-{self.chain_ns.max():.1f}  "
            f"repeat noise: max {self.chain_noise.max():.3f} cycles, median {np.median(self.chain_noise):.3f}",
            f"lines ({self.n_lines} x 128 B), cycles per load: min {lc.min():.1f}  median {np.median(lc):.1f}  "
            f"max {lc.max():.1f}; per-line mean over SMs {line_means.min():.1f}-{line_means.max():.1f}; "
            f"repeat noise median {np.median(self.line_noise):.3f}",
        ]
        verdict = m.get("trust")
        if verdict and not verdict.get("trusted", True):
            lines.append("NOT TRUSTED (failed its self-checks; not cached): " + "; ".join(verdict.get("problems", [])))
        for note in (verdict or {}).get("notes", []):
            lines.append(f"note: {note}")
        if self.source:
            lines.append(f"source: {self.source}")
        return "\n".join(lines)


def _check_meta(meta, n_sm: int) -> None:
    """TopologyFormatError unless the metadata fields other modules read have their types (_META_TYPES), cc is
    [major, minor] and the device's SM count is the arrays' own."""
    if not isinstance(meta, dict):
        raise TopologyFormatError(f"meta must be a dict, got {type(meta).__name__}")
    device = meta.get("device", {})
    for where, fields, values in (("meta", _META_TYPES, meta), ("meta['device']", _DEVICE_TYPES, device)):
        for key, kind in fields.items():
            value = values.get(key) if isinstance(values, dict) else None
            if key in values and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                wanted = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
                raise TopologyFormatError(f"{where}[{key!r}] is {type(value).__name__} {str(value)[:40]!r}, not "
                                          f"{wanted}")
    cc = device.get("cc", [0, 0])
    if len(cc) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in cc):
        raise TopologyFormatError(f"meta['device']['cc'] must be [major, minor], got {cc!r}")
    if device.get("sm_count", n_sm) != n_sm:
        raise TopologyFormatError(f"meta['device']['sm_count'] is {device['sm_count']} but the arrays hold {n_sm} SMs")


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(name.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()
