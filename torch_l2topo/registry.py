"""A registry of known device signatures on disk, and identify(): which enrolled GPU made a calibration.

One `<name>.json` per entry (plain JSON, no pickle), written atomically.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .errors import RegistryError
from .files import atomic_write
from .fingerprint import DEFAULT_THRESHOLD, DeviceSignature, compatible, distance, signature
from .topology import Topology

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Registry:
    """A directory of known signatures, one `<name>.json` per entry (plain JSON, no pickle).

    Writes are atomic (temporary file in the same directory, then os.replace), so a reader never sees
    half an entry. An entry that cannot be read or validated raises RegistryError naming its file.
    """

    def __init__(self, directory):
        self.directory = Path(directory).expanduser()

    def _path(self, name: str) -> Path:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name.endswith(".json"):
            raise RegistryError(f"registry names are 1-128 characters of letters, digits, '.', '_', '-' "
                                f"starting with a letter or digit (and not ending in .json), got {name!r}")
        return self.directory / f"{name}.json"

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

    def add(self, name: str, sig: DeviceSignature, replace: bool = False) -> Path:
        """Store `sig` under `name`; an existing name is an error unless replace=True."""
        if not isinstance(sig, DeviceSignature):
            raise TypeError(f"expected DeviceSignature, got {type(sig).__name__}")
        path = self._path(name)
        if path.exists() and not replace:
            raise RegistryError(f"registry entry {name!r} exists ({path}); pass replace=True to overwrite")
        return atomic_write(path, json.dumps(sig.to_dict()).encode())

    def remove(self, name: str) -> None:
        path = self._path(name)
        if not path.exists():
            raise RegistryError(f"no registry entry named {name!r} in {self.directory}")
        path.unlink()

    def get(self, name: str) -> DeviceSignature:
        path = self._path(name)
        if not path.exists():
            raise RegistryError(f"no registry entry named {name!r} in {self.directory}")
        return self._read(path)

    @staticmethod
    def _read(path: Path) -> DeviceSignature:
        try:
            return DeviceSignature.from_dict(json.loads(path.read_text()))
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError) as exc:
            raise RegistryError(f"registry entry {path} is corrupt: {exc}") from None

    def identify(self, topology_or_signature, threshold: float = DEFAULT_THRESHOLD) -> tuple:
        """(name or None, distance, margin): the nearest entry of the same device model.

        name is None when no compatible entry lies within `threshold`. distance: to the nearest compatible
        entry (inf if there is none). margin: the factor by which that distance clears the threshold on
        the side it falls (threshold / distance for a match, distance / threshold otherwise; 0 with no
        compatible entry). Entries of other models or lengths are skipped, never matched.
        """
        sig = topology_or_signature
        if isinstance(sig, Topology):
            sig = signature(sig)
        if not isinstance(sig, DeviceSignature):
            raise TypeError(f"identify() takes a Topology or DeviceSignature, got {type(sig).__name__}")
        if not threshold > 0:
            raise ValueError(f"threshold must be positive, got {threshold!r}")
        best_name, best = None, math.inf
        for path in self._entries():
            entry = self._read(path)
            if compatible(sig, entry):
                d = distance(sig, entry)
                if d < best:
                    best_name, best = path.stem, d
        if best_name is None:
            return None, math.inf, 0.0
        if best <= threshold:
            return best_name, best, (threshold / best if best > 0 else math.inf)
        return None, best, best / threshold
