"""Self-localization on the GPU: in-kernel L2 signatures, and where a kernel ran according to them.

A kernel calls l2_signature (triton_kernels/whereami.py, or cuda_ext/l2_signature.cuh) on a few chosen
lines of a buffer that this process measured with the line probe; the classifier (localize.py) maps the
cycle counts to SM, TPC, GPC and L2 partition. Line homes depend on physical addresses, so the buffer must
be the one that was measured: Localizer keeps both together. The SM labels come from calibrate() (cached,
labels.py), and the buffer is measured under the same per-GPU lock as a calibration.
"""
from __future__ import annotations

import numpy as np

from ..errors import check_choice
from ..layout import LINE_WORDS
from ..measure.launch import BACKENDS, launch

SIGNATURE_WARM = 2    # warm loads per line: the first load may miss in L2 after the calibration's eviction
SIGNATURE_TIMED = 8   # timed dependent loads per line, as in the line probe


def measure_signatures(lines, chosen, grid: int, backend: str = "triton"):
    """Launch `grid` one-warp CTAs that each record (%smid, signature over lines `chosen` of `lines`).

    Returns (smid (grid,), cycles per load (grid, k)). k = len(chosen) must be a power of two for Triton.
    """
    import torch

    check_choice("backend", backend, BACKENDS)
    chosen = np.asarray(chosen, dtype=np.int32)
    k = len(chosen)
    n_lines = lines.numel() // LINE_WORDS
    if k < 1 or chosen.min() < 0 or chosen.max() >= n_lines:
        raise ValueError(f"chosen lines must be in 0..{n_lines - 1}, got {chosen.tolist()}")
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    if backend == "triton" and k & (k - 1):
        raise ValueError(f"the Triton signature needs a power-of-two number of lines, got {k}")
    idx = torch.from_numpy(chosen).to(lines.device)
    out = torch.full((grid, k + 1), -1, dtype=torch.int64, device=lines.device)
    launch("whereami", backend, grid, lines, idx, out, SIGNATURE_WARM, SIGNATURE_TIMED)
    rows = out.cpu().numpy()
    return rows[:, 0], rows[:, 1:] / SIGNATURE_TIMED


class Localizer:
    """Tells a kernel where it runs: measures a small line buffer in this process, then classifies the
    l2_signature a kernel measures on the chosen lines of that buffer.

    The SM labels (partition, TPC, and GPC where the calibration has cluster ground truth: calibrate(gpc=True))
    come from `topology` (refused with CalibrationMismatch if it is of another GPU model or SM count), default
    calibrate(device, backend=backend), cached. Pass `lines` and `chosen` to your kernel (Triton:
    l2_signature(lines, chosen, pid, K, 2, 8); CUDA: l2_signature(lines, chosen, k, 2, 8, start, out)), divide
    its cycle counts by SIGNATURE_TIMED and hand them to locate().
    classifier.resolvable says which levels the chosen lines can tell apart.
    """

    def __init__(self, device=None, *, n_lines: int = 512, k: int = 16, backend: str = "triton",
                 topology=None, repeats: int = 3, timeout_s: float = 2.0):
        import torch

        from ..analysis.labels import sm_labels
        from ..device import resolve_device
        from ..measure.calibration import calibration_for, measuring
        from ..measure.probes import line_buffer, run_lines, warm_clocks
        from .localize import SMClassifier

        check_choice("backend", backend, BACKENDS)
        index = resolve_device(device)
        self.device = torch.device("cuda", index)
        self.backend = backend
        topology = calibration_for(index, topology, backend=backend)
        n_sm = topology.n_sm  # the device's: calibration_for checked it
        self.labels = sm_labels(topology)
        with measuring(index), torch.cuda.device(self.device):
            warm_clocks(self.device, 50)
            self.lines = line_buffer(n_lines, self.device)
            runs = run_lines(self.device, n_sm, n_lines, SIGNATURE_WARM, SIGNATURE_TIMED, backend, "waves",
                             timeout_s, repeats, lines=self.lines)
        self.line_cycles = np.median(np.stack([r.cycles for r in runs]), axis=0)
        self.classifier = SMClassifier().fit(self.line_cycles, self.labels.levels(), k)
        self.chosen = torch.from_numpy(np.asarray(self.classifier.chosen_lines, dtype=np.int32)).to(self.device)

    def measure(self, grid: int, backend: str | None = None):
        """Run the whereami kernel: (smid, signatures) of `grid` CTAs."""
        return measure_signatures(self.lines, self.classifier.chosen_lines, grid, backend or self.backend)

    def locate(self, signatures):
        """Prediction (see localize.Prediction) for signatures in cycles per load, shape (n, k)."""
        return self.classifier.predict(signatures)
