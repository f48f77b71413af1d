"""A registry of known device signatures on disk, and identify(): which enrolled GPU made a calibration.

One `<name>.json` per entry (plain JSON, no pickle), written atomically: the signature, and beside it the
hashed identifiers the GPU had when it was enrolled (uuid hash, board serial hash; null when unknown,
absent in entries written before they were recorded). identify() returns an Identification: a verdict
("match", "no match", "ambiguous"), the evidence behind it, and whether the GPU came back under a new uuid.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RegistryError
from ..files import atomic_write
from ..topology import Topology
from .fingerprint import (
    AMBIGUITY_FACTOR,
    AMBIGUOUS,
    DEFAULT_THRESHOLD,
    MATCH,
    NO_MATCH,
    DeviceSignature,
    compatible,
    decide,
    distance,
    signature,
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HASH = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class Entry:
    """One enrolled GPU: its signature and the hashed identifiers it had when enrolled (None: unknown)."""

    name: str
    signature: DeviceSignature
    uuid_hash: str | None = None
    serial_hash: str | None = None

    def same_device(self, other: "Entry") -> bool:
        """True only when known: equal board serials, or equal uuids where a serial is missing."""
        if self.serial_hash and other.serial_hash:
            return self.serial_hash == other.serial_hash
        return bool(self.uuid_hash) and self.uuid_hash == other.uuid_hash


@dataclass(frozen=True)
class Identification:
    """What identify() found. verdict: "match", "no match" or "ambiguous" (fingerprint.decide()).

    name: the entry the calibration was identified with, or may be ("match", "ambiguous"); None on "no match".
    nearest/distance: the nearest compatible entry, whatever the verdict (None/inf without one).
    runner_up/runner_up_distance: the nearest entry not known to be the same device as `nearest`.
    threshold and factor: the decision band [threshold / factor, threshold * factor]. margin: how far the
    nearest distance clears the threshold, as a factor (>1 on the side it falls; 0 without entries).
    uuid_changed: the matched entry was enrolled under another uuid (None when either uuid is unknown).
    serial_conflict: the map matches but the board serials differ (the map cannot tell these boards apart).
    notes: further evidence in words.
    """

    verdict: str
    name: str | None
    distance: float
    runner_up: str | None
    runner_up_distance: float
    threshold: float
    factor: float
    margin: float
    uuid_changed: bool | None = None
    serial_conflict: bool = False
    query_uuid_hash: str | None = None
    entry_uuid_hash: str | None = None
    notes: tuple = field(default_factory=tuple)
    nearest: str | None = None

    def explain(self) -> str:
        """The verdict in plain words, with the evidence (for the CLI and logs)."""
        band = f"threshold {self.threshold:.3g}, undecided between {self.threshold / self.factor:.3g} and " \
               f"{self.threshold * self.factor:.3g}"
        if self.nearest is None:
            text = "no match: the registry holds no entry of this GPU model"
        elif self.serial_conflict:
            text = (f"ambiguous: the map matches {self.name!r} (distance {self.distance:.3g}; {band}) but the board "
                    f"serials differ: the map cannot tell these two GPUs apart")
        elif self.verdict == MATCH:
            text = f"match: {self.name!r} (distance {self.distance:.3g}; {band})"
            if self.uuid_changed:
                text += (f"\nsame GPU, new UUID: {self.name!r} was enrolled with uuid hash {self.entry_uuid_hash}, "
                         f"this GPU now reports {self.query_uuid_hash}")
        elif self.verdict == AMBIGUOUS and self.runner_up is not None and self.runner_up_distance <= self.threshold:
            text = (f"ambiguous: two entries are within the threshold: {self.name!r} (distance {self.distance:.3g}) "
                    f"and {self.runner_up!r} ({self.runner_up_distance:.3g}); {band}. Either the map cannot tell "
                    f"them apart, or they are one GPU enrolled twice")
        elif self.verdict == AMBIGUOUS:
            text = (f"ambiguous: the nearest entry {self.name!r} is at distance {self.distance:.3g}, too close to "
                    f"the threshold to call ({band})")
        else:
            text = f"no match: the nearest entry {self.nearest!r} is at distance {self.distance:.3g} ({band})"
        return "\n".join([text, *self.notes])

    def to_dict(self) -> dict:
        """Plain JSON types: an infinite distance (no entry) becomes None."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update({k: None for k, v in d.items() if isinstance(v, float) and math.isinf(v)}, notes=list(self.notes))
        d["explanation"] = self.explain()
        return d


class Registry:
    """A directory of known signatures, one `<name>.json` per entry (plain JSON, no pickle).

    Writes are atomic (temporary file in the same directory, then os.replace), so a reader never sees
    half an entry. An entry that cannot be read or validated raises RegistryError naming its file, and so
    does identify() on a directory that does not exist (add() creates it).
    """

    def __init__(self, directory):
        self.directory = Path(directory).expanduser()

    def path_of(self, name: str) -> Path:
        """The file of entry `name`; raises RegistryError when the name is not a valid entry name."""
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name.endswith(".json"):
            raise RegistryError(f"registry names are 1-128 characters of letters, digits, '.', '_', '-' "
                                f"starting with a letter or digit (and not ending in .json), got {name!r}")
        return self.directory / f"{name}.json"

    def check_exists(self) -> None:
        """Raise RegistryError unless the registry directory exists: a mistyped path must not read as "no
        match"."""
        if not self.directory.is_dir():
            raise RegistryError(f"no registry at {self.directory}: enroll a GPU first (Registry.add, or "
                                f"`python -m torch_l2topo enroll NAME`)")

    def _entries(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        paths = sorted(p for p in self.directory.glob("*.json") if not p.name.startswith("."))
        for p in paths:
            if not _NAME.fullmatch(p.stem):
                raise RegistryError(f"registry file {p} does not carry a valid entry name")
        return paths

    def names(self) -> list[str]:
        return [p.stem for p in self._entries()]

    def add(self, name: str, calibration, replace: bool = False, *, uuid_hash: str | None = None,
            serial_hash: str | None = None) -> Path:
        """Enroll a Topology (its signature, uuid hash and serial hash from its metadata) or a DeviceSignature
        (hashes as given, else unknown) under `name`; an existing name is an error unless replace=True."""
        sig, uuid_hash, serial_hash = _query(calibration, uuid_hash, serial_hash)
        path = self.path_of(name)
        if path.exists() and not replace:
            raise RegistryError(f"registry entry {name!r} exists ({path}); pass replace=True to overwrite")
        doc = dict(sig.to_dict(), identity={"uuid_hash": uuid_hash, "serial_hash": serial_hash})
        return atomic_write(path, json.dumps(doc).encode())

    def remove(self, name: str) -> None:
        path = self.path_of(name)
        if not path.exists():
            raise RegistryError(f"no registry entry named {name!r} in {self.directory}")
        path.unlink()

    def get(self, name: str) -> Entry:
        path = self.path_of(name)
        if not path.exists():
            raise RegistryError(f"no registry entry named {name!r} in {self.directory}")
        return self._read(path)

    @staticmethod
    def _read(path: Path) -> Entry:
        try:
            doc = json.loads(path.read_text())
            sig = DeviceSignature.from_dict(doc)
            identity = doc.get("identity") or {}  # absent in entries written before identities were kept
            hashes = [_checked_hash(identity.get(k), k) for k in ("uuid_hash", "serial_hash")]
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
            raise RegistryError(f"registry entry {path} is corrupt: {exc}") from None
        return Entry(path.stem, sig, *hashes)

    def identify(self, calibration, threshold: float = DEFAULT_THRESHOLD, factor: float = AMBIGUITY_FACTOR, *,
                 uuid_hash: str | None = None, serial_hash: str | None = None) -> Identification:
        """Which enrolled GPU made `calibration` (a Topology, or a DeviceSignature with the hashes given).

        Entries of other device models or lengths are skipped, never matched. The verdict is
        fingerprint.decide() on the nearest entry and the nearest entry of another device; a query whose
        calibration failed its self-checks (meta["trust"]) never gets "no match", only "ambiguous": its
        distance may be the noise the check saw. A map match with a different board serial is reported
        as ambiguous (serial_conflict), a match under another uuid as uuid_changed.
        """
        sig, q_uuid, q_serial = _query(calibration, uuid_hash, serial_hash)
        if not threshold > 0 or not factor >= 1:
            raise ValueError(f"need threshold > 0 and factor >= 1, got {threshold!r}, {factor!r}")
        self.check_exists()
        ranked = sorted(((distance(sig, e.signature), e) for e in map(self._read, self._entries())
                         if compatible(sig, e.signature)), key=lambda pair: pair[0])
        if not ranked:
            return Identification(NO_MATCH, None, math.inf, None, math.inf, threshold, factor, 0.0,
                                  query_uuid_hash=q_uuid)
        best_d, best = ranked[0]
        runner_d, runner = next(((d, e) for d, e in ranked[1:] if not e.same_device(best)), (math.inf, None))
        verdict = decide(best_d, runner_d, threshold, factor)
        notes = []
        trust = calibration.meta.get("trust") if isinstance(calibration, Topology) else None
        if trust and not trust.get("trusted", True):
            notes.append("the query calibration failed its self-checks (" + "; ".join(trust.get("problems", []))
                         + "): a large distance may be that disturbance; recalibrate on an idle GPU")
            if verdict == NO_MATCH:
                verdict = AMBIGUOUS
        conflict = verdict == MATCH and bool(q_serial and best.serial_hash) and q_serial != best.serial_hash
        if conflict:
            verdict = AMBIGUOUS
        uuid_changed = None if not (q_uuid and best.uuid_hash) else q_uuid != best.uuid_hash
        if verdict == MATCH and uuid_changed:
            notes.append(f"the board serial (hash {q_serial}) is the enrolled one: the uuid changed, not the GPU"
                         if q_serial and q_serial == best.serial_hash else
                         "no board serial on both sides: this rests on the map alone")
        margin = best_d / threshold if best_d > threshold else threshold / best_d if best_d > 0 else math.inf
        return Identification(verdict, None if verdict == NO_MATCH else best.name, best_d,
                              runner.name if runner else None, runner_d, threshold, factor, margin,
                              uuid_changed=uuid_changed if verdict == MATCH else None, serial_conflict=conflict,
                              query_uuid_hash=q_uuid, entry_uuid_hash=best.uuid_hash, notes=tuple(notes),
                              nearest=best.name)


def _checked_hash(value, what: str) -> str | None:
    if value is not None and not (isinstance(value, str) and _HASH.fullmatch(value)):
        raise ValueError(f"{what} must be 12 lowercase hex digits or null, got {value!r}")
    return value


def _query(calibration, uuid_hash, serial_hash) -> tuple[DeviceSignature, str | None, str | None]:
    """(signature, uuid hash, serial hash) of a Topology or DeviceSignature; explicit hashes win over meta."""
    if isinstance(calibration, Topology):
        meta = calibration.meta
        uuid_hash = uuid_hash or meta.get("uuid_hash")
        serial_hash = serial_hash or meta.get("serial_hash")
        calibration = signature(calibration)
    if not isinstance(calibration, DeviceSignature):
        raise TypeError(f"expected a Topology or DeviceSignature, got {type(calibration).__name__}")
    try:
        return calibration, _checked_hash(uuid_hash, "uuid_hash"), _checked_hash(serial_hash, "serial_hash")
    except ValueError as exc:
        raise RegistryError(str(exc)) from None
