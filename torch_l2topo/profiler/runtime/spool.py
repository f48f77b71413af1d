"""The CTA records of profiled cycles, handed from the training process to the trace workers without a copy on
the host, and drained once for several cycles (docs/profiler.md, How it works).

A drain is one CUDA graph per GPU that copies the recorder's whole buffer into a slot (a page-locked file in
/dev/shm that both processes map), then one more on the GPU's drain counter into the slot's flag word, then
resets the recorder; copies complete in stream order, so the flag lands after the rows. The loop reads nothing
back: this process numbers the drains, and a job's SpooledRecords.load waits until the flag holds its number.
Held drains: each cycle takes its share without a CUDA call; the drain is launched once it holds
cycles_per_drain cycles, when a job that reads it leaves this process or runs here, before the recorder is
reset, or at flush(); each cycle's job keeps the CTAs of its own %globaltimer window (clock.py). A slot is busy
until every trace reading it is done (release); slots are reused across blocks (shared_spool()) and deleted at
exit (close; a signal: remove_files; a killed process's: lifecycle.remove_stale). Where page-locking or /dev/shm
is refused, a slot is pageable (in the temporary directory if need be) and drained op by op, synchronously.
This module imports torch only inside RecordSpool: the workers read slots with numpy alone.
"""
from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...files import owner_tag
from ...layout import REC_CAPACITY, REC_CURSOR, REC_END_NS, REC_HEADER, REC_START_NS, REC_WORDS, recorder_words
from ...measure.recording import CtaRecords, recorders
from .perprocess import PerProcess, this_pid

SLOT_PREFIX = "l2topo-records-"  # then files.owner_tag()-<device>-<random>.bin (lifecycle.remove_stale)
FLAG_WORD = 0          # slot word 0: the number of the GPU's drain whose copy is complete (1, 2, ...; cleared: -1)
BUFFER_WORD = 1        # then the recorder's buffer as it was: REC_HEADER header words, then the rows
DEFAULT_LOAD_TIMEOUT_S = 60.0
_POLL_S = 0.0002


class SpoolError(RuntimeError):
    """A slot's records never arrived (the GPU copy failed or the slot was reused)."""


class SpooledRecords(NamedTuple):
    """One GPU's records of one cycle, in a spool slot (picklable: the worker's job carries it). seq: the number
    the slot's flag word holds once the copy is there (the GPU's drain count); names, class_counts, device: as
    CtaRecords (the names and counts are shared snapshots: KernelTags.snapshot); window: (lo, hi) %globaltimer
    ns, the cycle's records among those of the drain (start >= lo and end <= hi; module docstring, Held drains),
    None for all of them. A named tuple, not a frozen dataclass: a cycle's handler makes one per GPU, and the
    dataclass's init took 0.8 us of it on the development machine (each such line costs about three times that
    at a cycle's edge: docs/profiler.md, Costs)."""

    path: str
    seq: int
    names: dict
    class_counts: dict
    device: int | None = None
    window: tuple | None = None

    def load(self, timeout_s: float | None = None) -> CtaRecords:
        """The records, once the slot's flag says the GPU's copy is complete (polled every 0.2 ms, up to
        timeout_s, default DEFAULT_LOAD_TIMEOUT_S; SpoolError after that). In the process that took the drain,
        a drain not launched yet is launched first.

        A full buffer kept its first rows and dropped the rest (the cursor counted them); the rows come in the
        order the CTAs ended, so a window that reaches past the last row kept may have lost rows, and reports
        the drain's whole count as dropped (an upper bound: the drain may hold later cycles too)."""
        launch = _launch_before_load.get((this_pid(), self.path, self.seq))
        if launch is not None:
            launch()
        timeout_s = DEFAULT_LOAD_TIMEOUT_S if timeout_s is None else timeout_s
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            deadline = time.monotonic() + timeout_s
            while (seen := _word(mm, FLAG_WORD)) != self.seq:
                if time.monotonic() > deadline:
                    raise SpoolError(f"the records of drain {self.seq} never arrived in {self.path} (its flag word "
                                     f"holds {seen})")
                time.sleep(_POLL_S)
            cursor, capacity = (_word(mm, BUFFER_WORD + i) for i in (REC_CURSOR, REC_CAPACITY))
            n = min(cursor, capacity)
            first = (BUFFER_WORD + REC_HEADER) * 8
            if first + n * REC_WORDS * 8 > len(mm):
                raise SpoolError(f"{self.path} holds fewer than the {n} records its header counts")
            rows = np.frombuffer(mm, dtype=np.int64, count=n * REC_WORDS, offset=first).reshape(n, REC_WORDS)
            if self.window is None:
                table, lost = rows.copy(), True  # a copy: slots are reused
            else:
                lo, hi = self.window
                table = rows[(rows[:, REC_START_NS] >= lo) & (rows[:, REC_END_NS] <= hi)]
                lost = n == 0 or hi > int(rows[:, REC_END_NS].max())
            del rows  # no view of the mapping may outlive it
        dropped = max(cursor - capacity, 0) if lost else 0
        return CtaRecords.from_table(table, self.names, self.class_counts, dropped, self.device)


def _word(mm, index: int) -> int:
    return int.from_bytes(mm[index * 8:index * 8 + 8], "little", signed=True)


# (pid, slot path, drain number) -> what launches that drain, while it is held, in the process that took it
_launch_before_load: dict = {}


def load_records(records: dict, timeout_s: float | None = None) -> dict:
    """{device: CtaRecords} from a job's records, each a CtaRecords or SpooledRecords (SpooledRecords.load's
    timeout_s)."""
    return {d: r.load(timeout_s) if isinstance(r, SpooledRecords) else r for d, r in records.items()}


def shm_directory() -> str | None:
    """"/dev/shm" where it is a writable directory (shared memory: slots, and session.py's exports), else None."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def spool_directory() -> Path:
    """Where slots go: /dev/shm where it is writable, else the temporary directory."""
    return Path(shm_directory() or tempfile.gettempdir())


class _Slot:
    """A mapped, page-locked (where allowed) file: the flag word, then room for a recorder buffer of `capacity`
    records."""

    def __init__(self, directory: Path, device: int, capacity: int):
        import torch

        self.capacity, self.device, self.busy = capacity, device, False
        self.readers = 0  # jobs that will read this slot's drain and have not released it (RecordSpool.release)
        # whole pages: cudaHostRegister refused a size that ends inside a page on the H200 machine
        # (benchmarks/diagnose/diag_host_register.py)
        n_bytes = -(-(BUFFER_WORD + recorder_words(capacity)) * 8 // mmap.PAGESIZE) * mmap.PAGESIZE
        fd, self.path = _backed_file(directory, f"{SLOT_PREFIX}{owner_tag()}-{device}-", n_bytes)
        try:
            self._mm = mmap.mmap(fd, n_bytes)
        finally:
            os.close(fd)
        self._host = np.frombuffer(self._mm, dtype=np.int64)
        self.words = torch.from_numpy(self._host)
        self.registered = _register(self.words)
        # the views a drain copies into, made once: slicing per drain costs the loop
        self.flag = self.words[FLAG_WORD:FLAG_WORD + 1]
        self.buffer = self.words[BUFFER_WORD:BUFFER_WORD + recorder_words(capacity)]
        self.graph = None       # the drain into this slot, captured (module docstring)
        self._graph_of = None   # the recorder it drains

    def clear_flag(self) -> None:
        self._host[FLAG_WORD] = -1

    def prepare(self, recorder, counter) -> None:
        """Capture the drain of `recorder` into this slot as a CUDA graph, unless it already is (module docstring);
        no graph where the slot is pageable or graphs cannot be captured."""
        if self._graph_of is not recorder:
            self.graph = _capture(lambda: self._drain_ops(recorder, counter), self.device) \
                if self.registered and not _capture_warned else None
            self._graph_of = recorder

    def drain(self, recorder, counter) -> None:
        """Queue the drain of `recorder` into this slot on the current stream (module docstring): the captured
        graph (captured now if prepare() has not); the operations one by one where a graph cannot hold them."""
        self.prepare(recorder, counter)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._drain_ops(recorder, counter)

    def _drain_ops(self, recorder, counter) -> None:
        self.buffer[:recorder.buffer.numel()].copy_(recorder.buffer, non_blocking=True)
        counter.add_(1)
        self.flag.copy_(counter, non_blocking=True)
        recorder.cursor.zero_()

    def close(self) -> None:
        import torch

        self.graph = self._graph_of = None  # the graph holds the slot's address: it goes first
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.words.data_ptr())
        del self.words, self.flag, self.buffer, self._host  # the buffer exports must go before the mapping closes
        self._mm.close()
        Path(self.path).unlink(missing_ok=True)


def _backed_file(directory: Path, prefix: str, n_bytes: int) -> tuple:
    """(fd, path) of a new file of n_bytes whose blocks are allocated: in `directory`, else in the temporary
    directory, warned once. Allocated up front because a container's /dev/shm is often 64 MB, and a copy into a
    page that a full tmpfs cannot back kills the process (SIGBUS) instead of failing."""
    for where in (Path(directory), Path(tempfile.gettempdir())):
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=".bin", dir=where)
        try:
            os.ftruncate(fd, n_bytes)
            if hasattr(os, "posix_fallocate"):  # Linux; elsewhere the size alone
                os.posix_fallocate(fd, 0, n_bytes)
            return fd, name
        except OSError as exc:
            os.close(fd)
            os.unlink(name)
            if where == Path(tempfile.gettempdir()):
                raise
            if not _room_warned:
                _room_warned.append(str(exc))
                warnings.warn(f"no room in {where} for a record slot of {n_bytes / 2**20:.1f} MiB ({exc}): slots go "
                              f"to {tempfile.gettempdir()}, where the GPU copies into them synchronously",
                              stacklevel=5)


_room_warned = []
_register_warned = []


def _register(words) -> bool:
    """Page-lock `words` for every GPU (cudaHostRegisterPortable); False, warned once, where that is refused."""
    import torch

    try:
        cudart = torch.cuda.cudart()
        err = cudart.cudaHostRegister(words.data_ptr(), words.numel() * 8, 1)
        ok = int(err) == 0
        why = "" if ok else f"cudaHostRegister returned error {int(err)}"
    except Exception as exc:  # no CUDA runtime here, or a torch without the binding: the slot stays pageable
        ok, why = False, f"{type(exc).__name__}: {exc}"
    if not ok:
        _consume_error()
        if not _register_warned:
            _register_warned.append(why)
            warnings.warn(f"torch_l2topo could not page-lock its record slots ({why}): each cycle's records are "
                          f"copied synchronously", stacklevel=4)
    return ok


def _capture(ops, device: int):
    """`ops` (CUDA operations on GPU `device`) captured as a CUDA graph on a side stream, ordered after the work
    queued so far; None, warned once, where capture fails (the caller then runs them one by one)."""
    import torch

    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")  # other threads may use CUDA meanwhile
            try:
                ops()
            finally:
                graph.capture_end()
    except RuntimeError as exc:
        _consume_error()
        if not _capture_warned:
            _capture_warned.append(str(exc))
            warnings.warn(f"torch_l2topo drains its CTA records without a CUDA graph ({exc}): four launches a cycle "
                          f"instead of one", stacklevel=5)
        return None
    current.wait_stream(side)
    return graph


_capture_warned = []


def _consume_error() -> None:
    """A failed runtime call leaves its error for the next one to report (cudaGetLastError): the next kernel
    launch check would raise it against an innocent kernel. Let a launch of ours take it instead."""
    import torch

    try:
        torch.zeros(1, device="cuda")
    except Exception:  # the stale error itself, now consumed
        pass


@dataclass
class _Drain:
    """A drain taken but not launched yet (module docstring, Held drains): its slot, the recorder it copies, the
    GPU's drain counter, its number, and the cycles that take their records from it."""

    slot: _Slot
    recorder: object
    counter: object
    seq: int
    cycles: int = 0


class RecordSpool:
    """Slots for the records of every background TraceHandler of the process (shared_spool(); module docstring).
    take() / take_all() give a cycle its share of a drain; launch_for(), flush() launch held drains;
    release() frees a slot once every trace reading it is written; close() deletes every slot."""

    def __init__(self, directory=None):
        self.directory = Path(directory) if directory is not None else spool_directory()
        self._lock = threading.Lock()
        self._slots: list = []
        self._free: dict = {}      # device -> its slots not busy, the one freed last at the end
        self._by_path: dict = {}
        self._drains: dict = {}    # device -> drains taken so far (the number the last one's flag will hold)
        self._counters: dict = {}  # device -> the drains launched, on the GPU, one int64 word (the flags' source)
        self._open: dict = {}      # device -> its _Drain taken and not launched yet

    def _take(self, device: int, capacity: int) -> _Slot:
        with self._lock:
            free = self._free.setdefault(device, [])
            if free and free[-1].capacity >= capacity:  # the usual case: every slot of a GPU has its capacity
                slot = free.pop()
            else:
                fits = [s for s in free if s.capacity >= capacity]
                slot = min(fits, key=lambda s: s.capacity) if fits else None
                if slot is None:
                    slot = _Slot(self.directory, device, capacity)
                    self._slots.append(slot)
                    self._by_path[slot.path] = slot
                else:
                    free.remove(slot)
            slot.busy = True
        slot.clear_flag()
        return slot

    def _put_back(self, slot: _Slot) -> None:
        """slot is free again (call with the lock held)."""
        if slot.busy:
            slot.busy = False
            self._free.setdefault(slot.device, []).append(slot)

    def reserve(self, device: int, capacity: int, count: int, recorder=None) -> None:
        """Make sure `count` free slots for a recorder of `capacity` records exist for GPU `device` and, given the
        recorder, that each free slot large enough has its drain captured: before profiling, since page-locking
        a slot and capturing its graph take milliseconds, a cycle's cost if done in the loop."""
        free = self._free.get(device, ())
        if len(free) < count or not all(s.capacity >= capacity for s in free):
            taken = [self._take(device, capacity) for _ in range(count)]
            with self._lock:
                for slot in taken:
                    self._put_back(slot)
        if recorder is not None:
            counter = self._counter(recorder)
            for slot in list(self._free.get(device, ())):
                if slot.capacity >= recorder.capacity:
                    slot.prepare(recorder, counter)

    def _counter(self, recorder):
        """GPU `recorder.device_index`'s drain counter (one int64 word on it), made on first use."""
        import torch

        counter = self._counters.get(recorder.device_index)
        if counter is None:
            counter = self._counters[recorder.device_index] = torch.zeros(1, dtype=torch.int64,
                                                                          device=recorder.buffer.device)
        return counter

    def take(self, recorder, window=None, cycles_per_drain: int = 1) -> SpooledRecords:
        """This cycle's records of `recorder`: those in `window` ((lo, hi) %globaltimer ns; None: all) of the drain
        its records go to, taken now if none is held (a free slot and the next number). No CUDA call unless the
        drain then holds cycles_per_drain cycles: then it is launched on the current stream (module docstring)."""
        device = recorder.device_index
        drain = self._open.get(device)
        if drain is None:
            slot = self._take(device, recorder.capacity)
            seq = self._drains[device] = self._drains.get(device, 0) + 1
            drain = self._open[device] = _Drain(slot, recorder, self._counter(recorder), seq)
            recorder.before_reset = self.flush
            _launch_before_load[(this_pid(), slot.path, seq)] = self.flush
        drain.cycles += 1
        drain.slot.readers += 1
        spooled = SpooledRecords(drain.slot.path, drain.seq, *recorder.tags.snapshot(), device, window)
        if drain.cycles >= cycles_per_drain:
            self._launch(device)
        return spooled

    def take_all(self, windows: dict, cycles_per_drain: dict) -> dict:
        """{device: SpooledRecords} of every recorder made so far (recording.recorders()): take() with the device's
        window and cycles per drain (defaults: None and 1, a drain of this cycle alone)."""
        return {index: self.take(r, windows.get(index), cycles_per_drain.get(index, 1))
                for index, r in recorders().items()}

    def holds(self, device: int) -> bool:
        """Whether a drain of GPU `device` is taken and not launched yet."""
        return device in self._open

    def launch_for(self, records: dict) -> None:
        """Launch the held drains that `records` ({device: CtaRecords or SpooledRecords}) read from: a job is about
        to leave this process (the worker would wait for them) or run here."""
        for r in records.values():
            drain = self._open.get(r.device) if isinstance(r, SpooledRecords) else None
            if drain is not None and drain.seq == r.seq and drain.slot.path == r.path:
                self._launch(r.device)

    def flush(self) -> None:
        """Launch every held drain (nothing held: returns at once)."""
        for device in list(self._open):
            self._launch(device)

    def _launch(self, device: int) -> None:
        drain = self._open.pop(device)
        drain.recorder.before_reset = None
        _launch_before_load.pop((this_pid(), drain.slot.path, drain.seq), None)
        self._queue(drain.slot, drain.recorder, drain.counter)
        drain.recorder.dirty = drain.recorder.in_graphs  # the drain reset it
        if drain.slot.readers == 0:
            with self._lock:
                self._put_back(drain.slot)

    @staticmethod
    def _queue(slot: _Slot, recorder, counter) -> None:
        """The drain of `recorder` into `slot`, queued on its GPU's current stream."""
        import torch

        if recorder.device_index == torch.cuda.current_device():
            slot.drain(recorder, counter)
        else:
            with torch.cuda.device(recorder.device_index):
                slot.drain(recorder, counter)

    def release(self, spooled: SpooledRecords) -> None:
        """A trace reading `spooled` is written: its slot is free once no other reads it and its drain is launched."""
        with self._lock:
            slot = self._by_path.get(spooled.path)
            if slot is not None:
                slot.readers = max(slot.readers - 1, 0)
                held = self._open.get(slot.device)
                if slot.readers == 0 and (held is None or held.slot is not slot):
                    self._put_back(slot)

    def remove_files(self) -> None:
        """Remove the slots' files now (the process is ending: its mappings stay valid until then; no CUDA call)."""
        for slot in self._slots:
            Path(slot.path).unlink(missing_ok=True)

    def busy(self) -> int:
        return sum(s.busy for s in self._slots)

    def close(self) -> None:
        """Launch the held drains, then unmap and delete every slot (call it once no job reads them)."""
        self.flush()
        with self._lock:
            for slot in self._slots:
                slot.close()
            self._slots.clear()
            self._free.clear()
            self._by_path.clear()


_shared = PerProcess(RecordSpool)


def shared_spool() -> RecordSpool:
    """The process's spool, made on first use (module docstring; perprocess.py)."""
    return _shared.get()


def flush_shared_spool() -> None:
    """Launch this process's held drains, if it has a spool (RecordSpool.flush)."""
    spool = _shared.existing()
    if spool is not None:
        spool.flush()


def launch_drains_for(records: dict) -> None:
    """Launch the held drains that `records` read from, if this process has a spool (RecordSpool.launch_for)."""
    spool = _shared.existing()
    if spool is not None:
        spool.launch_for(records)


def existing_spool() -> RecordSpool | None:
    """The process's spool if it was made, else None."""
    return _shared.existing()


def close_shared_spool() -> None:
    """Delete the process's slots (session.py calls it at exit, once the worker has written every trace)."""
    _shared.close()
