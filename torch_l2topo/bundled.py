"""Real calibrations shipped in the package (torch_l2topo/data/*.npz), for CPU use and tests.

Each file's metadata says which device (uuid hashed), when, with which backend, mode and command it was
measured. Names are the file stems, `<model>-<uuid hash>-<backend>-<mode>`; a model alone ("h100") names that
model's first calibration. Without a name, load_example() takes the local GPU's model when one of its maps is
bundled, else FALLBACK_MODEL, and its `source` says which and why.
"""
from __future__ import annotations

import re
from pathlib import Path

from .device import visible_gpu_name
from .topology import Topology

DATA_DIR = Path(__file__).resolve().parent / "data"
FALLBACK_MODEL = "h200"  # without a GPU, or on a model with no bundled map: the model with the most boards bundled


def list_examples() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.npz"))


def model_key(device_name: str) -> str | None:
    """The model as bundled names spell it: the first word of the device name holding a digit, lower case
    ("NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA A100-SXM4-40GB" -> "a100"); None when no word does."""
    words = [w for w in re.split(r"[\s_-]+", device_name) if any(c.isdigit() for c in w)]
    return words[0].lower() if words else None


def local_model() -> str | None:
    """model_key() of this machine's GPU (device.visible_gpu_name(): CUDA is not initialized for it); None when
    unknown or without a GPU."""
    name = visible_gpu_name()
    return model_key(name) if name else None


def default_example() -> tuple[str, str]:
    """(name, why): the bundled calibration a command uses when none is named, and the reason in words."""
    names, model = list_examples(), local_model()
    if model is not None and any(n.startswith(model + "-") for n in names):
        return example_path(model).stem, f"the model of this machine's GPU, {model}"
    where = f"no bundled calibration of this machine's GPU model, {model}" if model else "no CUDA GPU here"
    return example_path(FALLBACK_MODEL).stem, f"{where}: the {FALLBACK_MODEL} fallback"


def example_path(name: str) -> Path:
    """The file of a bundled calibration. A model alone ("h200") means its first calibration (sorted by name)."""
    names = list_examples()
    if name in names:
        return DATA_DIR / f"{name}.npz"
    matches = [n for n in names if n.startswith(name + "-") or n.startswith(name + "_")]
    if matches:
        return DATA_DIR / f"{matches[0]}.npz"
    raise ValueError(f"no bundled calibration named {name!r}; available: {', '.join(names) or 'none'}")


def load_example(name: str | None = None) -> Topology:
    """A bundled calibration (default: default_example()); its `source` (shown by summary(), never saved) names
    the example, and for the default, why it was chosen."""
    why = None
    if name is None:
        name, why = default_example()
    path = example_path(name)
    topo = Topology.load(path)
    topo.source = f"bundled example {path.stem}" + (f" (default: {why})" if why else "")
    return topo


def describe_example(name: str) -> str:
    """One line about a bundled calibration: device, uuid hash, backend and mode, date, GPC ground truth."""
    topo = load_example(name)
    m = topo.meta
    return (f"{m['device']['name']} (uuid-hash {m.get('uuid_hash', '?')}), {m.get('backend', '?')} backend, "
            f"{m.get('mode', '?')} mode, {m.get('config', {}).get('repeats', '?')} repeats, measured "
            f"{m.get('date', '?')[:10]}" + (", with GPC ground truth" if "gpc_truth" in topo.extras else ""))


def load_topology(spec) -> Topology:
    """A calibration from a file path, or else a bundled example's name (None: the default example): the one
    loader the CLI uses."""
    if spec is None:
        return load_example()
    path = Path(spec)
    if path.exists() or path.suffix == ".npz" or path.parent != Path("."):
        return Topology.load(path)
    return load_example(str(spec))
