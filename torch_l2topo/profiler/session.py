"""The torch.profiler hook: trace_handler() for on_trace_ready, and profile(), a thin torch.profiler.profile
that also manages the CTA recorders and Proton.

    with torch_l2topo.profile("traces/", schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
                              activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for batch in data:
            model(batch)
            prof.step()          # one enriched trace per active cycle, in traces/

    # or, with torch.profiler.profile itself:
    torch.profiler.profile(..., on_trace_ready=torch_l2topo.profiler.trace_handler("traces/"))

Each trace is the profiler's own export plus what enrich.py adds (the L2 map, per-CTA tracks, per-launch
metrics); if the enrichment fails, the profiler's plain trace is written instead and the reason is warned.

Recording: kernels built on the recorder helpers (and @sm_aware kernels) record their CTAs while
torch.profiler collects events (a TraceHandler switches that on; it is off during wait and warmup steps).
profile() does more: it switches recording on from the warmup steps of a block's first cycle, so the
recording variant of each kernel compiles before the active steps (a kernel first launched in a later cycle
compiles it in that cycle's first active launch); with background enrichment (the default) one drain takes up
to max_held + 1 cycles' records and each cycle's job keeps those of its own time window (HeldCycles, spool.py),
so the records CUDA graphs write when replayed between cycles (they record whenever replayed, if captured while
recording) and the first warmup's are left out; a recorder no drain holds is reset when a cycle starts. Capture
graphs while recording is on (inside profile(), or recording()) to see their CTAs.

Calibrations: topology="cached" (default) uses the latest cached calibration of each GPU in the trace and
never measures (a GPU without one gets no L2 map, and a note says how to make one); "calibrate" measures
missing ones with torch_l2topo.calibrate() (profile() does it before profiling starts); a Topology (for
the GPU its metadata names, else GPU 0) or {device index: Topology} is used as given; None: no map.

Proton: profile(proton=True) runs Proton's instrumentation for the whole block and merges its per-CTA
records into every trace at the end (Triton kernels with proton scopes, including kernels you did not
write); proton="path.chrome_trace" merges a Proton trace you recorded yourself. merge_proton() does it for
files written earlier.
"""
from __future__ import annotations

import atexit
import os
import socket
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import L2TopoError, TopologyFormatError
from ..placement import recording as rec
from . import clock, readback
from .cycle import CycleJob, enrich_with, run
from .enrich import Enrichment
from .proton_trace import load_proton, proton_records
from .smmap import map_of, map_of_file
from .spool import close_shared_spool, flush_shared_spool, shared_spool, shm_directory
from .tracefile import load_trace, write_trace
from .worker import DEFAULT_MAX_PENDING, check_max_held, check_max_pending, close_shared_worker, shared_worker

TOPOLOGY_MODES = ("cached", "calibrate")
EXPORT_ROOM_MIN = 256 << 20  # bytes of shared memory left free before an export goes there (_export_path)
EXPORT_ROOM_FACTOR = 4       # ... and this many times the largest export so far
EXPORT_ROOM_RECHECK_NS = 1_000_000_000  # the room is read again (statvfs) at least this often (_export_path)
DEFAULT_MAX_HELD = 8  # cycles a profile() block's worker leaves for its end (profile's max_held)
LINK_REFRESH_NS = 1_000_000_000  # a clock link this old is measured again (HeldCycles.windows)
REFRESH_READINGS = 3             # readings per measurement then (clock.READINGS when a block starts)


def held_cycles(max_held: int = DEFAULT_MAX_HELD) -> int:
    """Cycles whose records profile() sizes one drain for: max_held + 1, DEFAULT_MAX_HELD + 1 at most."""
    return min(max_held, DEFAULT_MAX_HELD) + 1


def held_capacity(capacity: int | None = None, max_held: int = DEFAULT_MAX_HELD) -> int:
    """Records of the recorder profile() asks for: `capacity` records (default recording.DEFAULT_CAPACITY) for
    each cycle a drain may hold (held_cycles; HeldCycles)."""
    return (capacity or rec.DEFAULT_CAPACITY) * held_cycles(max_held)


@dataclass
class HeldCycles:
    """What a profile() block tells its background handler so that one drain holds several cycles' records
    (spool.py, Held drains): per GPU, its clock link (clock.py) and the cycles a drain holds; and when the current
    cycle began collecting (host time.time_ns)."""

    links: dict = field(default_factory=dict)
    per_drain: dict = field(default_factory=dict)
    start_ns: int = 0

    def windows(self, end_ns: int) -> dict:
        """{device: (lo, hi)}: the %globaltimer window of the cycle that began at start_ns and ends at end_ns (host
        ns). A link older than LINK_REFRESH_NS is measured again first, so that the allowance for the clocks' drift
        stays near 0.1 ms; the GPU is idle then (the profiler has just synchronized it), and it happens once a
        second at most."""
        windows = {}
        for d, link in self.links.items():
            if end_ns - link.host_ns > LINK_REFRESH_NS:
                link = self.links[d] = clock.measure(d, REFRESH_READINGS)
            windows[d] = link.to_device(self.start_ns, end_ns)
        return windows


class TraceHandler:
    """on_trace_ready handler: export the cycle's trace, drain the CTA recorders, enrich, write.

    path_or_dir: a file name ending in .json or .json.gz (cycle n > 0 goes to name.n.json[.gz]) or a
    directory (one file per cycle: <host>_<pid>.<cycle>.l2topo.pt.trace.json, .gz with use_gzip).
    topology, include_ids: module docstring and SmMap. record: switch CTA recording on while torch.profiler
    collects. background: hand each cycle's enrichment and writing to the process's worker (worker.py), and
    its records to it through shared memory (spool.py), so the training loop waits only for the profiler's
    export and a few asynchronous copies; at most max_pending cycles in flight (in the process's worker, every
    background handler's together); call wait() (or close()) before reading the traces. written: the paths
    written so far.
    """

    def __init__(self, path_or_dir, *, topology="cached", include_ids: bool = False, record: bool = True,
                 use_gzip: bool = False, background: bool = False, max_pending: int = DEFAULT_MAX_PENDING):
        if isinstance(topology, str) and topology not in TOPOLOGY_MODES:
            raise ValueError(f"topology must be a Topology, a dict of them, None or one of {TOPOLOGY_MODES}; "
                             f"got {topology!r}")
        self.target = Path(path_or_dir)
        self.is_file = self.target.name.endswith((".json", ".json.gz"))
        self._target = str(self.target)
        self._directory = str(self.target.parent if self.is_file else self.target)
        self.use_gzip = use_gzip
        self.topology, self.include_ids = topology, include_ids
        self.written: list = []
        self._cycles = 0           # traces handed out (written, or in the worker's hands)
        self.max_pending = check_max_pending(max_pending)
        self._worker = shared_worker() if background else None
        self._spooled: dict = {}   # trace path -> {device: SpooledRecords} its job reads (released once written)
        self._dir_made = False
        self._calibrations: dict = {}  # (devices recorded, maps looked up) -> calibrations()
        self._maps: dict = {}      # device -> SmMap or None (looked up once)
        self._notes: dict = {}     # device -> why it has no map
        self._pid = os.getpid()
        self._host = f"{socket.gethostname()}_{self._pid}"
        self._cuda = None          # whether CUDA is available (asked once)
        # profile() sets it (background only): what lets one drain hold several cycles' records; as made here (no
        # clock link), each cycle's records are drained whole when it ends
        self.held = HeldCycles()
        self._export_dir = shm_directory()  # where exports go while it has room (_export_path); None: beside traces
        self._largest_export = 0
        self._last_call_ns = None   # when the handler last ran (the cycle's period: Worker.keeps_up)
        self._export_room = 0       # bytes free there when last read, less the exports written since
        self._room_read_ns = 0      # when it was last read (host time.time_ns)
        if record:
            rec.follow_profiler()

    @property
    def background(self) -> bool:
        """Whether a worker process enriches and writes the traces (the background option)."""
        return self._worker is not None

    # ---- calibrations --------------------------------------------------------------------------------------
    def _given(self) -> dict:
        if self.topology is None or isinstance(self.topology, str):
            return {}
        if isinstance(self.topology, dict):
            return dict(self.topology)
        return {int(self.topology.meta.get("device", {}).get("index", 0)): self.topology}

    def smmap(self, device: int):
        """The SmMap of GPU `device` (None when there is no calibration), looked up once per handler (and each
        calibration analysed once per process: smmap.map_of)."""
        if device not in self._maps:
            topo = self._given().get(device)
            if topo is not None:
                self._maps[device] = map_of(topo, self.include_ids)
            elif isinstance(self.topology, str):
                self._maps[device] = self._looked_up(device)
            else:
                self._maps[device] = None
        return self._maps[device]

    def _looked_up(self, device: int):
        from ..device import device_uuid
        from ..measure import cache
        from ..measure.calibration import calibrate

        if not torch.cuda.is_available() or device >= torch.cuda.device_count():
            self._notes[device] = f"GPU {device}: not visible to this process, no calibration looked up"
            return None
        if self.topology == "calibrate":
            return map_of(calibrate(device), self.include_ids)
        for path in cache.calibration_files(device_uuid(device)):
            try:
                return map_of_file(path, self.include_ids)
            except (TopologyFormatError, OSError):
                continue
        self._notes[device] = (f"GPU {device}: no cached calibration, so no L2 map; run "
                               f"torch_l2topo.calibrate({device}) once, or pass topology='calibrate'")
        return None

    def prepare(self, devices) -> None:
        """Look up (or measure) the calibrations of `devices` now, and start the background worker, before
        profiling starts."""
        for d in devices:
            self.smmap(d)
        if self._worker is not None:
            self._worker.start()

    # ---- one cycle -----------------------------------------------------------------------------------------
    # What runs in the training loop (the handler, once a cycle) works on strings, not pathlib: on the H200 machine
    # each pathlib operation there cost ~5 us of a profiled cycle's host time.
    def _path_of(self, n: int) -> str:
        """Where cycle n's trace goes (a file name given: cycle n > 0 goes to name.n.json[.gz])."""
        if self.is_file:
            if n == 0:
                return self._target
            stem, suffix = (self._target[:-8], ".json.gz") if self._target.endswith(".json.gz") else \
                (self._target[:-5], ".json")
            return f"{stem}.{n}{suffix}"
        return f"{self._target}{os.sep}{self._host}.{n}.l2topo.pt.trace.json{'.gz' if self.use_gzip else ''}"

    def __call__(self, prof) -> None:
        now = time.time_ns()
        if self._cuda is None:
            self._cuda = torch.cuda.is_available()
        if not self._cuda:
            records = {}
        elif self._worker is not None:
            records = shared_spool().take_all(self.held.windows(now), self.held.per_drain)
        else:
            records = rec.drain_all()
        path = self._path_of(self._cycles)
        self._cycles += 1
        if records and self._worker is not None:
            self._spooled[path] = records
        if not self._dir_made:  # every cycle's trace goes to one directory
            os.makedirs(self._directory, exist_ok=True)
            self._dir_made = True
        export = self._export_path(now)
        try:
            prof.export_chrome_trace(export)
            if self._room_read_ns == now:  # the room was read for this export: its size is read too
                self._largest_export = max(self._largest_export, os.path.getsize(export))
            self._export_room -= self._largest_export  # wherever it went: at worst the room is read again sooner
        except BaseException:
            Path(export).unlink(missing_ok=True)
            raise
        job = CycleJob(export, path, records, *self.calibrations(records))
        if self._worker is not None:
            period_s = None if self._last_call_ns is None else (now - self._last_call_ns) * 1e-9
            self._last_call_ns = now
            self._worker.submit(job, self._done, self.max_pending, beside=self._worker.keeps_up(period_s))
        else:
            self._done(path, run(job))

    def _export_path(self, now_ns: int) -> str:
        """Where the profiler exports the cycle's trace for the enrichment to read: shared memory (tmpfs) while it
        has room for EXPORT_ROOM_FACTOR times the largest export so far (and EXPORT_ROOM_MIN), else beside the
        traces. In tmpfs the loop's export writes no disk blocks, so it is not throttled behind the worker's trace
        writes (the filesystem's writeback); torch's export does not report a full disk, hence the margin. The
        room is read (statvfs), and the export's size after it, when the last reading less the largest export for
        each export since falls short, and at least once every EXPORT_ROOM_RECHECK_NS (others use /dev/shm too):
        not every cycle, as each system call costs the loop at a cycle's edge (3 us each hot on the development
        machine). A name of this handler's own (not mkstemp: its random name and exclusive create cost the loop
        0.1 ms)."""
        name = f"l2topo-export-{self._pid}-{id(self):x}-{self._cycles}.json"
        if self._export_dir is not None:
            need = max(EXPORT_ROOM_MIN, EXPORT_ROOM_FACTOR * self._largest_export)
            if self._export_room < need or now_ns - self._room_read_ns > EXPORT_ROOM_RECHECK_NS:
                try:
                    st = os.statvfs(self._export_dir)
                    self._export_room = st.f_bavail * st.f_frsize
                except OSError:
                    self._export_room = 0
                self._room_read_ns = now_ns
            if self._export_room >= need:
                return f"{self._export_dir}{os.sep}{name}"
        return f"{self._directory}{os.sep}.{name}"

    def calibrations(self, records: dict) -> tuple:
        """({device: SmMap or None}, {device: note}, given devices) for the GPUs a trace may hold: those given,
        looked up before, recorded, and, for cached calibrations (a file lookup each, once per handler), every
        visible GPU. enrich_with shows the maps of the GPUs the trace has kernels or records of, and the given."""
        key = (frozenset(records), len(self._maps))
        if key not in self._calibrations:
            self._calibrations[key] = self._look_up(set(records))
        return self._calibrations[key]

    def _look_up(self, recorded: set) -> tuple:
        devices = set(self._given()) | set(self._maps) | recorded
        if self.topology == "cached" and torch.cuda.is_available():
            devices |= set(range(torch.cuda.device_count()))
        maps = {d: self.smmap(d) for d in sorted(devices)}
        return maps, {d: self._notes[d] for d in maps if d in self._notes}, tuple(sorted(self._given()))

    def _done(self, path: str, problem: str | None) -> None:
        for spooled in self._spooled.pop(path, {}).values():
            shared_spool().release(spooled)
        if problem:
            warnings.warn(problem, stacklevel=3)
        self.written.append(Path(path))

    def wait(self) -> None:
        """Wait until every trace handed to the background worker is written (profile() does it when it stops;
        this process helps with the traces the worker has not started)."""
        if self._worker is not None:
            flush_shared_spool()
            self._worker.drain()

    def close(self) -> None:
        """wait(). The worker process stays for the process's later handlers; it ends at exit."""
        self.wait()

    def enrichment(self, trace: dict, records: dict, proton=None, proton_quantum_ns: float = 0.0) -> Enrichment:
        """What enriches `trace` with this handler's calibrations, `records` ({device: CtaRecords}) and Proton's."""
        return enrich_with(trace, *self.calibrations(records), records, proton, proton_quantum_ns)

    def merge_proton(self, proton_path) -> None:
        """Merge a Proton instrumentation trace into every trace this handler wrote (module docstring)."""
        for path in self.written:
            merge_proton(path, proton_path, topology=self._given() or None, include_ids=self.include_ids)


@atexit.register
def _close_at_exit() -> None:
    """Nothing lost at exit: the worker writes every trace still in flight and ends, then the spool's slots go."""
    close_shared_worker()
    close_shared_spool()


def trace_handler(path_or_dir, **options) -> TraceHandler:
    """An on_trace_ready handler for torch.profiler.profile that writes enriched traces to `path_or_dir`
    (TraceHandler has the options). Creating it switches per-CTA recording on for the steps torch.profiler
    collects."""
    return TraceHandler(path_or_dir, **options)


class profile(torch.profiler.profile):
    """torch.profiler.profile writing enriched traces to `path_or_dir` (module docstring), with the CTA
    recorders switched on from the warmup steps and reset when each cycle starts.

    topology, include_ids, use_gzip: TraceHandler's. background: enrich and write each cycle's trace in a
    worker process (TraceHandler; every trace is written when the block ends). max_held: with background, the
    worker starts on a block's traces when its steps are over, or once more than max_held cycles wait (then it
    works beside the steps; 0: from the first cycle on), or as soon as the cycles last more than twice its last
    job (worker.Worker.keeps_up: long steps, where its work beside them costs nothing measurable and the block's
    end then waits for one trace, not for all). Waiting cycles keep their export in shared memory and their records
    in a spool slot. max_pending: TraceHandler's (more than max_held).
    record: record CTAs of instrumented kernels.
    capacity: records per GPU per cycle (placement.recording.DEFAULT_CAPACITY). devices: GPUs whose
    recorders and calibrations are set up before profiling (default: the current one). proton: False, True
    (run Proton's instrumentation for the block) or the path of a Proton trace to merge at the end. Every
    other keyword goes to torch.profiler.profile (activities, schedule, record_shapes, ...); on_trace_ready
    is this class's own.
    """

    def __init__(self, path_or_dir="l2topo_traces", *, topology="cached", include_ids: bool = False,
                 record: bool = True, capacity: int | None = None, devices=None, proton=False,
                 use_gzip: bool = False, background: bool = True, max_held: int = DEFAULT_MAX_HELD,
                 max_pending: int = DEFAULT_MAX_PENDING, **profiler_options):
        if "on_trace_ready" in profiler_options:
            raise TypeError("torch_l2topo.profile writes its own traces; to combine with another on_trace_ready, "
                            "use torch.profiler.profile(on_trace_ready=...) and call a TraceHandler from it")
        # record=False: this class switches recording itself (prepare_trace .. stop_trace), so that a plain
        # torch.profiler run in the same process does not start recording
        self.handler = TraceHandler(path_or_dir, topology=topology, include_ids=include_ids, record=False,
                                    use_gzip=use_gzip, background=background, max_pending=max_pending)
        self.record, self.capacity, self.proton = record, capacity, proton
        self.max_held = check_max_held(max_held, self.handler.max_pending)
        self.devices = devices
        self._recording = False
        self._devices: list = []  # the GPUs recorded in this block (start())
        self._recorded = False  # a cycle of this block has recorded (later cycles record from their active steps)
        self._proton_dir = None
        super().__init__(on_trace_ready=self.handler, **profiler_options)

    @property
    def written(self) -> list:
        return self.handler.written

    def _device_list(self) -> list:
        if self.devices is not None:
            return [int(d) for d in self.devices]
        return [torch.cuda.current_device()] if torch.cuda.is_available() else []

    def start(self) -> None:
        self._recorded = False
        devices = self._device_list()
        # the GPUs to record on, found once a block: prepare_trace and start_trace run in the training loop
        self._devices = devices if torch.cuda.is_available() else []
        self.handler.prepare(devices)
        if self.proton is True:
            import triton.profiler as proton

            self._proton_dir = tempfile.mkdtemp(prefix="l2topo-proton-")
            proton.start(os.path.join(self._proton_dir, "proton"), backend="instrumentation", data="trace")
        if self.handler.background:
            self.handler.held = self._hold_cycles() if self.record else HeldCycles()
            self.handler._worker.hold(self.max_held)
        if self.record and self._devices:  # the recorders made now (_hold_cycles sized them), not in the loop
            rec.set_up(self._devices, self.capacity, reset=False)
        try:
            super().start()
        except BaseException:
            if self.handler.background:
                self.handler._worker.release()
            raise

    def _hold_cycles(self) -> HeldCycles:
        """Set up each GPU so that one drain holds up to max_held + 1 cycles (spool.py, Held drains): a recorder of
        that many cycles' capacity (DEFAULT_MAX_HELD + 1 at most; an existing smaller recorder holds fewer), two
        slots with their drains captured (the held drain's, and the next one's while the first is read), and the
        clock link, all now rather than in the loop (page-locking a slot takes milliseconds)."""
        per_cycle = self.capacity or rec.DEFAULT_CAPACITY
        wanted = held_cycles(self.max_held)
        held = HeldCycles()
        for d in self._devices:
            recorder = rec.recorder(d, per_cycle * wanted, at_least=per_cycle)
            shared_spool().reserve(d, recorder.capacity, 2, recorder)
            try:
                held.links[d] = clock.measure(d)
            except Exception as exc:  # no Triton, or the kernel failed: each cycle drained whole, as without profile()
                warnings.warn(f"torch_l2topo could not relate GPU {d}'s clock to the host's ({type(exc).__name__}: "
                              f"{exc}): its records are drained every cycle", stacklevel=3)
                continue
            held.per_drain[d] = max(1, min(self.max_held + 1, recorder.capacity // per_cycle))
            if held.per_drain[d] < wanted:
                warnings.warn(f"GPU {d}'s CTA recorder, made earlier, holds {recorder.capacity} records: its drains "
                              f"hold {held.per_drain[d]} cycles, not {wanted}, and cost the loop more "
                              f"(docs/profiler.md, Costs); make it first with "
                              f"torch_l2topo.placement.recording.recorder({d}, "
                              f"torch_l2topo.profiler.held_capacity({self.capacity or ''}))", stacklevel=3)
        return held

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.handler.background:
                self.handler._worker.release()
        self.handler.close()  # every trace written before stop() returns
        if self.proton is True and self._proton_dir is not None:
            import triton.profiler as proton

            proton.finalize()
            found = sorted(Path(self._proton_dir).glob("proton*"))
            self._merge(found[0] if found else None)
        elif self.proton:
            self._merge(self.proton)

    def _merge(self, proton_path) -> None:
        """Merge Proton's trace into every trace written; a problem is warned, not raised (the traces stand)."""
        try:
            if proton_path is None:
                raise FileNotFoundError("Proton wrote no trace (did a kernel with proton scopes run?)")
            self.handler.merge_proton(proton_path)
        except (OSError, ValueError, L2TopoError) as exc:
            warnings.warn(f"Proton's CTAs were not merged: {exc}", stacklevel=3)

    def _start_recording(self) -> None:
        if self.record and not self._recording and self._devices:
            rec.set_profiling(True)  # start() made the recorders; start_trace resets them if need be
            self._recording = True

    def prepare_trace(self) -> None:
        if not self._recorded:  # the block's first cycle records from its warmup: the kernels compile there
            self._start_recording()
        super().prepare_trace()

    def start_trace(self) -> None:
        self._start_recording()
        if self._recording:  # the warmup's records, or a graph's replayed between cycles (a launch: only if any),
            rec.reset_dirty()  # unless a held drain still has to take the earlier cycles' records
        self.handler.held.start_ns = time.time_ns()
        super().start_trace()

    def stop_trace(self) -> None:
        super().stop_trace()
        if self._recording:
            rec.set_profiling(False)
            self._recording = False
            self._recorded = True


def merge_proton(trace_path, proton_path, dst=None, *, topology=None, include_ids: bool = False) -> Path:
    """Merge Proton's per-CTA records into the trace file `trace_path`, plain or enriched, written to `dst`
    (default: in place, atomically; an error leaves the file untouched). An enriched trace keeps its CTAs
    (realigned on their own, already aligned, times) and its calibrations unless `topology` replaces them."""
    trace = load_trace(trace_path)
    maps = readback.calibrations(trace)
    handler = TraceHandler(dst or trace_path, topology=topology, include_ids=include_ids, record=False)
    handler._maps.update({d: m for d, m in maps.items() if d not in handler._given()})
    clocks = [m.sm_clock_ghz for m in handler._maps.values() if m is not None]
    records, quantum = proton_records(load_proton(proton_path), clocks[0] if clocks else 1.0, str(proton_path))
    return write_trace(handler.enrichment(trace, readback.recorded_ctas(trace), records, quantum).trace(),
                       dst or trace_path)
