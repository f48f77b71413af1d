"""The CTA recorder's host side: one fixed device buffer per GPU that kernels append per-CTA records to, the
switch that says whether recording is on, and the records read back as numpy columns (CtaRecords).

Two readers: the profiler (per-SM tracks of a trace) and placement policy "measured" (per_sm_statistics()).
Kernels write through triton_kernels/recorder.py or cuda_ext/recorder.cuh (the record: layout.py REC_*).

    with recording():                      # on, for every GPU that launches a recording kernel
        rec = active_recorder(0)           # None when recording is off: launch with RECORD false
        my_kernel[grid](..., rec.buffer, rec.register("my_kernel"), RECORD=True)
        records = rec.drain()              # CtaRecords: one row per CTA

Graph-safe: a buffer is allocated once per GPU and process and never moved or freed, so a captured graph keeps
a valid address (and still records when replayed with recording off: one atomic per CTA, left out by the
profiler); nothing synchronizes per launch. A full buffer drops records and counts them (CtaRecords.dropped).
torch is imported lazily: CtaRecords and per_sm_statistics are numpy. Docs: docs/profiler.md.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..errors import PlacementError
from ..layout import (
    REC_CAPACITY,
    REC_CURSOR,
    REC_END_NS,
    REC_HEADER,
    REC_ITEMS,
    REC_NEAR,
    REC_PROGRAM,
    REC_SM,
    REC_START_NS,
    REC_TAG,
    REC_WORDS,
    recorder_words,
)

# Records per GPU: 64 Ki records of 7 int64 words is 3.5 MiB, room for 496 launches of a 132-CTA persistent
# kernel (or one launch of 64 Ki CTAs) per profiling cycle.
DEFAULT_CAPACITY = 1 << 16
COLUMNS = ("tag", "sm", "program", "start_ns", "end_ns", "items", "near")
_WORD_OF = {"tag": REC_TAG, "sm": REC_SM, "program": REC_PROGRAM, "start_ns": REC_START_NS, "end_ns": REC_END_NS,
            "items": REC_ITEMS, "near": REC_NEAR}


@dataclass(frozen=True)
class CtaRecords:
    """Records of one drain, one row per CTA, as int64 numpy columns (COLUMNS; near is -1 where the kernel did
    not count near items). names: {tag: kernel name}. class_counts: {tag: items per class (partition 0,
    partition 1, unknown)} for kernels registered with item classes. dropped: records lost to a full buffer.
    device: the CUDA device index (None: not known, as for Proton's records)."""

    tag: np.ndarray
    sm: np.ndarray
    program: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    items: np.ndarray
    near: np.ndarray
    names: dict = field(default_factory=dict)
    class_counts: dict = field(default_factory=dict)
    dropped: int = 0
    device: int | None = None

    def __post_init__(self):
        n = None
        for name in COLUMNS:
            col = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            if col.ndim != 1 or (n is not None and len(col) != n):
                raise ValueError(f"CtaRecords columns must be 1-D of one length; {name} has shape {col.shape}")
            n = len(col)
            object.__setattr__(self, name, col)
        # a tag nobody registered (a kernel handed a stale tag) keeps its records, under a name that says so
        unknown = set(np.unique(self.tag).tolist()) - set(self.names)
        object.__setattr__(self, "names", {**{t: f"unregistered tag {t}" for t in unknown}, **self.names})

    def __len__(self) -> int:
        return len(self.tag)

    @classmethod
    def empty(cls, device: int | None = None) -> CtaRecords:
        return cls(*(np.zeros(0, np.int64) for _ in COLUMNS), device=device)

    @classmethod
    def from_words(cls, header, rows, names: dict, class_counts: dict | None = None,
                   device: int | None = None) -> CtaRecords:
        """Parse a recorder buffer read back from the device: its REC_HEADER header words and its first
        min(cursor, capacity) records as a flat int64 array."""
        header = np.asarray(header, dtype=np.int64)
        cursor, capacity = int(header[REC_CURSOR]), int(header[REC_CAPACITY])
        table = np.asarray(rows, dtype=np.int64).reshape(-1, REC_WORDS)
        if len(table) != min(cursor, capacity):
            raise ValueError(f"expected {min(cursor, capacity)} records, got {len(table)}")
        return cls.from_table(table, names, class_counts, max(cursor - capacity, 0), device)

    @classmethod
    def from_table(cls, table, names: dict, class_counts: dict | None = None, dropped: int = 0,
                   device: int | None = None) -> CtaRecords:
        """Records from an (n, REC_WORDS) int64 table of rows as the recorder writes them."""
        return cls(*(table[:, _WORD_OF[c]] for c in COLUMNS), names=dict(names),
                   class_counts=dict(class_counts or {}), dropped=dropped, device=device)

    @classmethod
    def concat(cls, parts) -> CtaRecords:
        """The rows of several CtaRecords of one device in one (names, class counts and drops merged)."""
        parts = list(parts)
        if not parts:
            return cls.empty()
        names, classes = {}, {}
        for p in parts:
            names.update(p.names)
            classes.update(p.class_counts)
        return cls(*(np.concatenate([getattr(p, c) for p in parts]) for c in COLUMNS), names=names,
                   class_counts=classes, dropped=sum(p.dropped for p in parts), device=parts[0].device)

    def select(self, mask) -> CtaRecords:
        """The rows where `mask` is true (same names, no dropped count)."""
        mask = np.asarray(mask)
        return CtaRecords(*(getattr(self, c)[mask] for c in COLUMNS), names=self.names,
                          class_counts=self.class_counts, device=self.device)

    def of_kernel(self, name: str) -> CtaRecords:
        tags = [t for t, n in self.names.items() if n == name]
        return self.select(np.isin(self.tag, tags))

    def kernel_names(self) -> list:
        """Names of the kernels that have records, in tag order."""
        present = set(np.unique(self.tag).tolist())
        return [self.names[t] for t in sorted(present)]

    def to_arrays(self) -> dict:
        """Plain arrays and JSON-able metadata (for np.savez: the recorded fixtures of the tests)."""
        import json

        meta = {"names": {str(k): v for k, v in self.names.items()},
                "class_counts": {str(k): list(map(int, v)) for k, v in self.class_counts.items()},
                "dropped": int(self.dropped), "device": self.device}
        return {**{c: getattr(self, c) for c in COLUMNS},
                "meta_json": np.frombuffer(json.dumps(meta).encode(), np.uint8)}

    @classmethod
    def from_arrays(cls, arrays) -> CtaRecords:
        import json

        meta = json.loads(bytes(np.asarray(arrays["meta_json"], dtype=np.uint8)).decode())
        return cls(*(arrays[c] for c in COLUMNS), names={int(k): v for k, v in meta["names"].items()},
                   class_counts={int(k): v for k, v in meta["class_counts"].items()}, dropped=meta["dropped"],
                   device=meta["device"])


def per_sm_statistics(records: CtaRecords, n_sm: int, kernel: str | None = None) -> dict:
    """{"items", "busy_ns", "ctas"}: (n_sm,) int64 per-SM sums over the records (of one kernel when `kernel`
    names it), the statistics of layout.py's placement state (STAT_*) from the recorder: items done, ns from
    each CTA's start to its record summed over its CTAs, CTAs. Records of SMs >= n_sm are left out."""
    if kernel is not None:
        records = records.of_kernel(kernel)
    keep = (records.sm >= 0) & (records.sm < n_sm)
    sm = records.sm[keep]
    busy = (records.end_ns - records.start_ns)[keep]
    return {"items": np.bincount(sm, weights=records.items[keep], minlength=n_sm).astype(np.int64),
            "busy_ns": np.bincount(sm, weights=busy, minlength=n_sm).astype(np.int64),
            "ctas": np.bincount(sm, minlength=n_sm).astype(np.int64)}


class KernelTags:
    """Kernel names and the tags records carry for them; per tag, the census of the kernel's item classes."""

    def __init__(self):
        self._tags: dict = {}
        self.class_counts: dict = {}
        self._lock = threading.Lock()
        self._version = 0          # changes with every registration that changes the names or the class counts
        self._snapshot = (-1, {}, {})

    @property
    def names(self) -> dict:
        return {t: n for n, t in self._tags.items()}

    def register(self, name: str, item_class=None) -> int:
        """The tag for kernel `name` (the same name always gets the same tag). item_class: the home partition
        of each of the kernel's items (0, 1; 2: unknown), if they have one: the profiler compares the kernel's
        near share with what placement blind to the map would give."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a kernel name must be a non-empty string, got {name!r}")
        with self._lock:
            if name not in self._tags:
                self._tags[name] = len(self._tags)
                self._version += 1
            tag = self._tags[name]
        if item_class is not None:
            classes = np.asarray(item_class.detach().cpu() if hasattr(item_class, "detach") else item_class)
            if classes.size and (classes.dtype.kind not in "iu" or not np.isin(classes, (0, 1, 2)).all()):
                raise ValueError("item_class values must be 0, 1 (home partition) or 2 (unknown)")
            counts = np.bincount(classes.ravel().astype(np.int64), minlength=3).tolist()
            with self._lock:
                if self.class_counts.get(tag) != counts:
                    self.class_counts[tag] = counts
                    self._version += 1
        return tag

    def snapshot(self) -> tuple:
        """(names, class_counts) as they are now: copies made once per change and shared by every caller until
        the next (the profiler hands them to each cycle's job; do not modify them)."""
        with self._lock:
            if self._snapshot[0] != self._version:
                self._snapshot = (self._version, {t: n for n, t in self._tags.items()},
                                  {t: list(c) for t, c in self.class_counts.items()})
            return self._snapshot[1:]


class CtaRecorder:
    """The record buffer of one GPU (int64 tensor `buffer`, fixed for the life of the process) and the names
    of the kernels that record into it. Use recorder() / active_recorder() rather than building one: a second
    buffer for the same GPU would split its records."""

    def __init__(self, device_index: int, capacity: int = DEFAULT_CAPACITY):
        import torch

        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        if torch.cuda.is_current_stream_capturing():
            raise PlacementError("a CTA recorder cannot be set up during CUDA graph capture: start recording "
                                 "(torch_l2topo.profiler.recording()) before capturing")
        self.device_index = int(device_index)
        self.capacity = capacity
        header = np.zeros(recorder_words(capacity), dtype=np.int64)
        header[REC_CAPACITY] = capacity
        self.buffer = torch.from_numpy(header).to(torch.device("cuda", self.device_index))
        # the record count, a one-word view made once: reset() and the profiler's drain run in the training loop
        self.cursor = self.buffer[REC_CURSOR:REC_CURSOR + 1]
        self.tags = KernelTags()
        # Whether records may have been written since the last reset or drain: a launch was handed this recorder
        # (active_recorder) since then, or a CUDA graph captured with it may replay at any time (in_graphs). The
        # profiler resets a recorder when a cycle starts only if it is dirty: a reset is a launch, host time in
        # every profiled cycle. A kernel launched with the buffer of recorder() itself, not of active_recorder(),
        # is not seen: reset() before profiling then.
        self.dirty = False
        self.in_graphs = False
        # A drain that holds this recorder's records but is not launched yet (the profiler's spool holds several
        # cycles' records in the buffer and drains them together): called, once, before the next reset or drain,
        # which would otherwise lose them.
        self.before_reset = None

    @property
    def address(self) -> int:
        """The buffer's device address (what a plan header holds; recorder_at() turns it back into a pointer)."""
        return self.buffer.data_ptr()

    @property
    def names(self) -> dict:
        """{tag: kernel name} of every kernel registered so far."""
        return self.tags.names

    def register(self, name: str, item_class=None) -> int:
        """The tag for kernel `name` (KernelTags.register)."""
        return self.tags.register(name, item_class)

    def reset(self) -> None:
        """Forget the records so far: zero the cursor on the current stream (no synchronization)."""
        import torch

        if torch.cuda.is_current_stream_capturing():
            raise PlacementError("the recorder is reset outside CUDA graph capture (a captured reset would run "
                                 "on every replay)")
        if self.settle():
            return  # the held drain took the records and reset the cursor
        self.cursor.zero_()
        self.dirty = self.in_graphs

    def settle(self) -> bool:
        """Launch the drain that holds this recorder's records (before_reset) if there is one; whether there was."""
        hook, self.before_reset = self.before_reset, None
        if hook is None:
            return False
        hook()
        return True

    def drain(self) -> CtaRecords:
        """The records written since the last reset or drain, then reset. Waits for the GPU's work to finish:
        call it after the step (the profiler, enriching inline, calls it once per cycle)."""
        import torch

        self.settle()
        torch.cuda.synchronize(self.device_index)
        header = self.buffer[:REC_HEADER].cpu().numpy()
        n = min(int(header[REC_CURSOR]), self.capacity)
        rows = self.buffer[REC_HEADER:REC_HEADER + n * REC_WORDS].cpu().numpy()
        self.reset()
        return CtaRecords.from_words(header, rows, self.names, self.tags.class_counts, self.device_index)


class _Switch:
    """Whether recording is on: inside recording() blocks (nested ones count), while a profiler says so
    (set_profiling), or, once follow_profiler() was called, whenever torch.profiler collects events; and the
    recorders made so far."""

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0
        self.profiling = False
        self.follow = False
        self.capacity = DEFAULT_CAPACITY
        self.recorders: dict = {}
        self.warned: set = set()


_switch = _Switch()


def recorder(device_index: int, capacity: int | None = None, at_least: int | None = None) -> CtaRecorder:
    """The recorder of GPU `device_index`, created on first use with `capacity` records (default
    DEFAULT_CAPACITY). It is never replaced: a graph may hold its address. An existing recorder with fewer than
    `at_least` (default: capacity) records is kept, with a warning."""
    index = int(device_index)
    least = at_least or capacity
    with _switch.lock:
        rec = _switch.recorders.get(index)
        if rec is None:
            rec = _switch.recorders[index] = CtaRecorder(index, capacity or _switch.capacity)
        elif least and least > rec.capacity and (index, least) not in _switch.warned:
            _switch.warned.add((index, least))
            warnings.warn(f"GPU {index}'s CTA recorder keeps its {rec.capacity} records (a CUDA graph may hold its "
                          f"address); ask for {capacity} before the first recording in the process", stacklevel=2)
    return rec


def recording_on() -> bool:
    """Whether kernels launched now should record (module docstring; the one test active_recorder makes)."""
    if _switch.depth > 0 or _switch.profiling:
        return True
    if not _switch.follow:
        return False
    import torch

    return torch.autograd._profiler_enabled()  # true exactly while torch.profiler collects (not during warmup)


def follow_profiler() -> None:
    """From now on, record whenever torch.profiler collects events (the profiler's trace handler calls it)."""
    _switch.follow = True


def active_recorder(device_index: int) -> CtaRecorder | None:
    """The recorder kernels on GPU `device_index` should write to, or None when recording is off (launch
    them with RECORD false). During CUDA graph capture a GPU without a recorder yet gets None, with a
    warning: its buffer cannot be set up inside the capture."""
    if not recording_on():
        return None
    rec = _switch.recorders.get(int(device_index))
    if rec is not None:
        if not rec.in_graphs:  # a graph captured with it marks it for good (dirty)
            import torch

            rec.in_graphs = torch.cuda.is_current_stream_capturing()
        rec.dirty = True
        return rec
    import torch

    if torch.cuda.is_current_stream_capturing():
        if int(device_index) not in _switch.warned:
            _switch.warned.add(int(device_index))
            warnings.warn(f"GPU {device_index} had no CTA recorder when this CUDA graph was captured: its kernels "
                          f"are not recorded; pass devices=[{device_index}] to recording()", stacklevel=2)
        return None
    return recorder(device_index)


def start_recording(devices=None, capacity: int | None = None, reset: bool = True) -> None:
    """Turn recording on (nestable; stop_recording() turns one level off). devices: GPU indices whose
    recorders are set up and (unless reset is false) reset now (default: the current GPU); other GPUs get
    theirs on first use."""
    set_up(devices, capacity, reset)
    with _switch.lock:
        _switch.depth += 1


def set_up(devices=None, capacity: int | None = None, reset: bool = True) -> None:
    """start_recording() without turning recording on: the recorders of `devices` made (and reset unless reset is
    false), and `capacity` the least for those made later."""
    import torch

    if capacity is not None:
        _switch.capacity = max(_switch.capacity, capacity)
    if devices is None:
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    for index in devices:
        rec = recorder(index, capacity)
        if reset:
            rec.reset()


def stop_recording() -> None:
    with _switch.lock:
        _switch.depth = max(_switch.depth - 1, 0)


def set_profiling(on: bool) -> None:
    """Recording on while a profiler collects (on), or not (off): one flag, which profiler.profile sets when each
    cycle starts and clears when it stops, after set_up() once (cheaper at the cycle's edges than
    start_recording() and stop_recording(), on hosts where each Python line is slow)."""
    _switch.profiling = bool(on)


def reset_dirty() -> None:
    """Reset the recorders that may hold records since their last reset or drain (CtaRecorder.dirty): the start of
    a profiling cycle. A recorder whose records a held drain still has to take (before_reset) is left as it is: the
    profiler tells that drain's cycles apart by time (profiler/runtime/spool.py)."""
    for rec in list(_switch.recorders.values()):
        if rec.dirty and rec.before_reset is None:
            rec.reset()


def recorders() -> dict:
    """{device index: CtaRecorder} of every recorder made so far, by device."""
    with _switch.lock:
        return dict(sorted(_switch.recorders.items()))


def drain_all() -> dict:
    """{device index: CtaRecords} of every recorder made so far (each drained and reset)."""
    return {index: rec.drain() for index, rec in recorders().items()}


@contextmanager
def recording(devices=None, capacity: int | None = None):
    """Recording on inside the block (start_recording / stop_recording)."""
    start_recording(devices, capacity)
    try:
        yield
    finally:
        stop_recording()
