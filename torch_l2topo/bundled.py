"""Real H200 calibrations shipped in the package (torch_l2topo/data/*.npz), for CPU use and tests.

Each file's metadata says which device (uuid hashed), when, with which backend, mode and command it was
measured. Names are the file stems; "h200" is the default example.
"""
from __future__ import annotations

from pathlib import Path

from .topology import Topology

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_EXAMPLE = "h200"


def list_examples() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.npz"))


def example_path(name: str = DEFAULT_EXAMPLE) -> Path:
    """The file of a bundled calibration. "h200" means the first H200 calibration (sorted by name)."""
    names = list_examples()
    if name in names:
        return DATA_DIR / f"{name}.npz"
    matches = [n for n in names if n.startswith(name + "-") or n.startswith(name + "_")]
    if matches:
        return DATA_DIR / f"{matches[0]}.npz"
    raise ValueError(f"no bundled calibration named {name!r}; available: {', '.join(names) or 'none'}")


def load_example(name: str = DEFAULT_EXAMPLE) -> Topology:
    """A bundled calibration; its `source` (shown by summary(), never saved) names the example."""
    path = example_path(name)
    topo = Topology.load(path)
    topo.source = f"bundled example {path.stem}"
    return topo


def describe_example(name: str) -> str:
    """One line about a bundled calibration: device, uuid hash, backend and mode, date, GPC ground truth."""
    topo = load_example(name)
    m = topo.meta
    return (f"{m['device']['name']} (uuid-hash {m.get('uuid_hash', '?')}), {m.get('backend', '?')} backend, "
            f"{m.get('mode', '?')} mode, {m.get('config', {}).get('repeats', '?')} repeats, measured "
            f"{m.get('date', '?')[:10]}" + (", with GPC ground truth" if "gpc_truth" in topo.extras else ""))


def load_topology(spec) -> Topology:
    """A calibration from a file path, or else a bundled example's name: the one loader the CLI uses."""
    path = Path(spec)
    if path.exists() or path.suffix == ".npz" or path.parent != Path("."):
        return Topology.load(path)
    return load_example(str(spec))
