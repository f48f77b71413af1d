"""The torch.profiler hook: trace_handler() for on_trace_ready, and profile(), a torch.profiler.profile that
also manages the CTA recorders, the background enrichment and Proton.

    with torch_l2topo.profile("traces/", schedule=torch.profiler.schedule(wait=1, warmup=1, active=2)) as prof:
        for batch in data:
            model(batch)
            prof.step()          # one trace per active cycle in traces/, enriched in place

Each cycle's trace is first exported where it belongs, exactly as torch.profiler's own handler would write it,
then replaced atomically by its enriched version (enrich.py: the L2 map, per-CTA tracks, per-launch metrics).
Nothing of ours raises from prof.step() or the block's end, and every wait is bounded: a failure costs that
cycle's enrichment and one warning (docs/profiler.md, Safety). Calibrations: topology="cached" (the latest
cached calibration of each GPU; never measures), "calibrate" (measures missing ones before profiling), a
Topology or {device: Topology}, or None. docs/profiler.md is the guide.
"""
from __future__ import annotations

import atexit
import contextlib
import math
import os
import shutil
import socket
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import TopologyFormatError
from ..measure import recording as rec
from .runtime import clock, lifecycle
from .runtime.cycle import CycleJob, enrich_with, run, warn
from .runtime.spool import SpooledRecords, close_shared_spool, flush_shared_spool, shared_spool
from .runtime.worker import DEFAULT_MAX_PENDING, check_max_held, check_max_pending, close_shared_worker, shared_worker
from .trace import readback
from .trace.enrich import Enrichment
from .trace.proton_trace import load_proton, proton_records
from .trace.smmap import map_of, map_of_file
from .trace.tracefile import load_trace, write_trace

TOPOLOGY_MODES = ("cached", "calibrate")
KERNEL_MODES = ("recorded", "triton")  # profile(kernels=): which kernels get CTA tracks
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
    """on_trace_ready handler: export the cycle's trace where it belongs, then enrich it in place.

    path_or_dir: a file name ending in .json or .json.gz (cycle n > 0 goes to name.n.json[.gz]) or a
    directory (one file per cycle: <host>_<pid>.<stamp>.<cycle>.l2topo.pt.trace.json, .gz with use_gzip; the
    stamp, the handler's creation in ms, keeps a later block or run from writing over these traces).
    topology, include_ids: module docstring and SmMap. record: switch CTA recording on while torch.profiler
    collects. background: enrich in the process's trace worker (worker.py), its records handed over through
    shared memory (spool.py), so the training loop waits only for the profiler's export; at most max_pending
    cycles in flight (beyond that a trace stays plain, warned). timeout_s: how long wait() and a profile()
    block's end wait for the enrichment (None: worker.Worker.default_timeout). written: the traces on disk.

    Safety (docs/profiler.md): a call never raises; each cycle's plain trace is on disk when the call returns,
    and enrichment only replaces it atomically; any failure costs that cycle's enrichment and one warning.
    """

    def __init__(self, path_or_dir, *, topology="cached", include_ids: bool = False, record: bool = True,
                 use_gzip: bool = False, background: bool = False, max_pending: int = DEFAULT_MAX_PENDING,
                 timeout_s: float | None = None):
        if isinstance(topology, str) and topology not in TOPOLOGY_MODES:
            raise ValueError(f"topology must be a Topology, a dict of them, None or one of {TOPOLOGY_MODES}; "
                             f"got {topology!r}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not 0 <= timeout_s < math.inf):
            raise ValueError(f"timeout_s must be a finite number of seconds >= 0, or None; got {timeout_s!r}")
        self.target = Path(path_or_dir)
        self.is_file = self.target.name.endswith((".json", ".json.gz"))
        # absolute: the worker processes, started once per process, need not share this process's current directory
        self._target = os.path.abspath(self.target)
        self.directory = os.path.dirname(self._target) if self.is_file else self._target
        self.use_gzip = use_gzip
        self.topology, self.include_ids = topology, include_ids
        self.timeout_s = timeout_s
        self.written: list = []
        self._cycles = 0           # cycles handled
        self.max_pending = check_max_pending(max_pending)
        self._worker = shared_worker() if background else None
        self._spooled: dict = {}   # trace path -> {device: SpooledRecords} its job reads (released once done)
        self._dir_made = False
        self._calibrations: dict = {}  # (devices recorded, maps looked up) -> calibrations()
        self._maps: dict = {}      # device -> SmMap or None (looked up once)
        self._notes: dict = {}     # device (None: the whole trace) -> why it has no map
        # unique per handler, as torch's own handler names each trace by its time: a later block of the process (or a
        # later run with the same pid, as in containers) writes new files instead of over these, which also spares
        # the loop truncating a large enriched trace at every export
        self._host = f"{socket.gethostname()}_{os.getpid()}.{time.time_ns() // 1_000_000}"
        self._cuda = None          # whether CUDA is available (asked once)
        # profile() sets it (background only): what lets one drain hold several cycles' records; as made here (no
        # clock link), each cycle's records are drained whole when it ends
        self.held = HeldCycles()
        self._last_call_ns = None  # when the handler last ran (the cycle's period: Worker.keeps_up)
        # profile(kernels="triton") sets it when a cycle starts: {"instrumented": [names], "plain": {name: why}}
        self.triton_kernels = None
        lifecycle.install_signal_handlers()
        if record:
            rec.follow_profiler()

    @property
    def background(self) -> bool:
        """Whether a worker process enriches the traces (the background option)."""
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
        if isinstance(self.topology, str) and not torch.cuda.is_available() and None not in self._notes:
            self._notes[None] = "no CUDA GPU visible to this process: no L2 map and no CTA records in this trace"
            warnings.warn(f"torch_l2topo.profile: {self._notes[None]}; the traces are torch.profiler's own plus "
                          f"this note")
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
        """The cycle's end: records taken, the plain trace exported to its path, its enrichment queued or run.
        Never raises: a failure leaves the plain trace (or, if torch could not write it, nothing more than torch
        wrote) and warns once, naming the trace."""
        now = time.time_ns()
        path = self._path_of(self._cycles)
        self._cycles += 1
        try:
            records = self._take_records(now)
        except Exception as exc:
            records = {}
            warn(f"torch_l2topo could not take the CTA records of {path} ({type(exc).__name__}: {exc}); "
                          f"it has none")
        try:
            if not self._dir_made:  # every cycle's trace goes to one directory
                os.makedirs(self.directory, exist_ok=True)
                self._dir_made = True
            prof.export_chrome_trace(path)
            if not os.path.getsize(path):  # torch only logs a failed write (a full disk)
                raise OSError(f"torch.profiler wrote an empty {path} (is its disk full?)")
        except Exception as exc:
            self._release(records)
            warn(f"torch_l2topo: cycle {self._cycles - 1}'s trace {path} was not written whole "
                          f"({type(exc).__name__}: {exc}); the job goes on")
            return
        self.written.append(Path(path))
        try:
            if records and self._worker is not None:
                self._spooled[path] = records
            job = CycleJob(path, records, *self.calibrations(records), triton_kernels=self.triton_kernels)
            if self._worker is None:
                self._done(path, run(job))
                return
            period_s = None if self._last_call_ns is None else (now - self._last_call_ns) * 1e-9
            self._last_call_ns = now
            if not self._worker.submit(job, self._done, self.max_pending, beside=self._worker.keeps_up(period_s)):
                self._done(path, f"{path} stays as torch.profiler wrote it: {self.max_pending} traces were already "
                                 f"waiting for their enrichment (max_pending)")
        except Exception as exc:
            self._spooled.pop(path, None)
            self._release(records)
            warn(f"torch_l2topo could not enrich {path} ({type(exc).__name__}: {exc}); it stays as "
                          f"torch.profiler wrote it")

    def _take_records(self, now_ns: int) -> dict:
        """This cycle's CTA records ({device: CtaRecords or SpooledRecords}); none without CUDA."""
        if self._cuda is None:
            self._cuda = torch.cuda.is_available()
        if not self._cuda:
            return {}
        if self._worker is not None:
            return shared_spool().take_all(self.held.windows(now_ns), self.held.per_drain)
        return rec.drain_all()

    @staticmethod
    def _release(records: dict) -> None:
        """Free the spool slots that `records` read from (their trace is done, or will not be enriched)."""
        for r in records.values():
            if isinstance(r, SpooledRecords):
                shared_spool().release(r)

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
        notes = {d: self._notes[d] for d in (None, *maps) if d in self._notes}
        return maps, notes, tuple(sorted(self._given()))

    def _done(self, path: str, problem: str | None) -> None:
        self._release(self._spooled.pop(path, {}))
        if problem:
            warn(problem)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until every trace handed to the background worker is enriched, at most timeout_s (default: the
        handler's timeout_s); traces still waiting then stay plain, each warned. Never raises."""
        if self._worker is None:
            return
        try:
            flush_shared_spool()
        except Exception as exc:  # the held records will not come: their traces stay plain (the drain says so)
            warn(f"torch_l2topo could not copy the held CTA records ({type(exc).__name__}: {exc})")
        self._worker.drain(self.timeout_s if timeout_s is None else timeout_s)

    def close(self) -> None:
        """wait(). The worker processes stay for the process's later handlers; they end at exit."""
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
    """At exit: the worker finishes the traces in flight (bounded: Worker.drain) and ends, then the slots go."""
    for close in (close_shared_worker, close_shared_spool):
        try:
            close()
        except Exception as exc:  # at exit: say so, and let the other go on
            warn(f"torch_l2topo at exit: {close.__name__} failed ({type(exc).__name__}: {exc})")


def trace_handler(path_or_dir, **options) -> TraceHandler:
    """An on_trace_ready handler for torch.profiler.profile that writes enriched traces to `path_or_dir`.

    Args: path_or_dir and **options as TraceHandler (topology, include_ids, record, use_gzip, background,
    max_pending, timeout_s). Returns: the TraceHandler; creating it switches per-CTA recording on for the steps
    torch.profiler collects. Raises: ValueError for a bad option; the handler itself never raises.
    """
    return TraceHandler(path_or_dir, **options)


class profile(torch.profiler.profile):
    """torch.profiler.profile writing enriched traces to `path_or_dir` (module docstring), with the CTA
    recorders switched on from the warmup steps and reset when each cycle starts.

    Args:
        path_or_dir: a directory (one trace per cycle) or a .json/.json.gz file name (TraceHandler).
        topology, include_ids, use_gzip, max_pending, timeout_s: TraceHandler's.
        background: enrich in worker processes (default); the block's end waits for them, at most timeout_s.
        max_held: with background, the workers start on a block's traces when its steps are over, or once more
            than max_held wait (0: from the first cycle on), or as soon as the cycles last more than twice their
            last job (worker.Worker.keeps_up).
        record: record the CTAs of instrumented kernels. capacity: records per GPU per cycle
            (recording.DEFAULT_CAPACITY). devices: GPUs set up before profiling (default: the current one).
        proton: False, True (run Proton's instrumentation for the block) or the path of a Proton trace to merge.
        kernels: "recorded" (CTA tracks for kernels that record themselves: @sm_aware, the recorder helpers) or
            "triton" (also every Triton kernel the process has loaded, Inductor's included: each active cycle runs
            their instrumented twins, profiler/kernels/twins.py; docs/profiler.md, Whole-model profiling).
        **profiler_options: torch.profiler.profile's (activities, schedule, record_shapes, ...).
    Raises: TypeError for on_trace_ready (this class's own), ValueError for a bad option. Nothing of ours raises
    from prof.step() or the block's end (docs/profiler.md, Safety).
    """

    def __init__(self, path_or_dir="l2topo_traces", *, topology="cached", include_ids: bool = False,
                 record: bool = True, capacity: int | None = None, devices=None, proton=False,
                 use_gzip: bool = False, background: bool = True, max_held: int = DEFAULT_MAX_HELD,
                 max_pending: int = DEFAULT_MAX_PENDING, timeout_s: float | None = None,
                 kernels: str = "recorded", **profiler_options):
        if kernels not in KERNEL_MODES:
            raise ValueError(f"kernels must be one of {KERNEL_MODES}, got {kernels!r}")
        if "on_trace_ready" in profiler_options:
            raise TypeError("torch_l2topo.profile writes its own traces; to combine with another on_trace_ready, "
                            "use torch.profiler.profile(on_trace_ready=...) and call a TraceHandler from it")
        # record=False: this class switches recording itself (prepare_trace .. stop_trace), so that a plain
        # torch.profiler run in the same process does not start recording
        self.handler = TraceHandler(path_or_dir, topology=topology, include_ids=include_ids, record=False,
                                    use_gzip=use_gzip, background=background, max_pending=max_pending,
                                    timeout_s=timeout_s)
        self.record, self.capacity, self.proton, self.kernels = record, capacity, proton, kernels
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
        lifecycle.remove_stale(self.handler.directory)  # the handler installed the signal handlers
        self.handler.prepare(devices)
        if self.proton is True:
            self._start_proton()
        if self.record and self._devices:
            try:
                self._set_up_recording()
            except Exception as exc:  # profiling goes on without CTA records
                self._devices = []
                warnings.warn(f"torch_l2topo could not set up CTA recording ({type(exc).__name__}: {exc}): this "
                              f"block's traces have no CTA tracks")
        if self.handler.background:
            self.handler._worker.hold(self.max_held)
        try:
            super().start()
        except BaseException:
            if self.handler.background:
                self.handler._worker.release()
            raise

    def _set_up_recording(self) -> None:
        """The recorders (and with background, the slots and clock links that let one drain hold several cycles:
        _hold_cycles), made now rather than in the loop (page-locking a slot takes milliseconds)."""
        if self.handler.background:
            self.handler.held = self._hold_cycles()
        rec.set_up(self._devices, self.capacity, reset=False)

    def _hold_cycles(self) -> HeldCycles:
        """Set up each GPU so that one drain holds up to max_held + 1 cycles (spool.py, Held drains): a recorder of
        that many cycles' capacity (DEFAULT_MAX_HELD + 1 at most; an existing smaller recorder holds fewer), two
        slots with their drains captured (the held drain's, and the next one's while the first is read), and the
        clock link."""
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
                              f"{exc}): its records are drained every cycle")
                continue
            held.per_drain[d] = max(1, min(self.max_held + 1, recorder.capacity // per_cycle))
            if held.per_drain[d] < wanted:
                warnings.warn(f"GPU {d}'s CTA recorder, made earlier, holds {recorder.capacity} records: its drains "
                              f"hold {held.per_drain[d]} cycles, not {wanted}, and cost the loop more "
                              f"(docs/profiler.md, Costs); make it first with "
                              f"torch_l2topo.measure.recording.recorder({d}, "
                              f"torch_l2topo.profiler.held_capacity({self.capacity or ''}))")
        return held

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.handler.background:
                self.handler._worker.release()
            self.handler.wait()  # bounded; never raises
            self._merge_proton()

    def _start_proton(self) -> None:
        """Start Proton's instrumentation for the block, its trace in a directory of its own (removed when the block
        ends); where Proton cannot start, the block runs without it, warned."""
        self._proton_dir = tempfile.mkdtemp(prefix="l2topo-proton-")
        try:
            import triton.profiler as proton

            proton.start(os.path.join(self._proton_dir, "proton"), backend="instrumentation", data="trace")
        except Exception as exc:
            shutil.rmtree(self._proton_dir, ignore_errors=True)
            self._proton_dir = None
            warnings.warn(f"torch_l2topo could not start Proton ({type(exc).__name__}: {exc}): this block's traces "
                          f"have no Proton CTAs")

    def _merge_proton(self) -> None:
        """Merge Proton's trace into every trace written (proton=True: the block's own, then its directory goes);
        a problem is warned, not raised (the traces stand)."""
        try:
            if self.proton is True and self._proton_dir is not None:
                import triton.profiler as proton

                proton.finalize()
                found = sorted(Path(self._proton_dir).glob("proton*"))
                if not found:
                    raise FileNotFoundError("Proton wrote no trace (did a kernel with proton scopes run?)")
                self.handler.merge_proton(found[0])
            elif self.proton:
                self.handler.merge_proton(self.proton)
        except Exception as exc:
            warn(f"Proton's CTAs were not merged: {type(exc).__name__}: {exc}")
        finally:
            if self._proton_dir is not None:
                shutil.rmtree(self._proton_dir, ignore_errors=True)
                self._proton_dir = None

    def _quietly(self, what: str, action) -> None:
        """Run our part of a profiler transition; a failure stops this block's CTA recording, warned, and never
        reaches prof.step()."""
        try:
            action()
        except Exception as exc:
            self._devices, self.record = [], False
            warn(f"torch_l2topo: {what} failed ({type(exc).__name__}: {exc}); CTA recording is off for "
                          f"the rest of this block")

    def _start_recording(self) -> None:
        if self.record and not self._recording and self._devices:
            rec.set_profiling(True)  # start() made the recorders; start_trace resets them if need be
            self._recording = True

    def prepare_trace(self) -> None:
        if not self._recorded:  # the block's first cycle records from its warmup: the kernels compile there
            self._quietly("starting CTA recording", self._start_recording)
        if self.kernels == "triton" and self._devices:  # the twins built in the warmup, not the active steps
            self._twins_do("build", lambda twins: twins.build({d: rec.recorder(d) for d in self._devices}))
        super().prepare_trace()

    def _twins_do(self, what: str, action):
        """action(the process's Twins) for kernels="triton"; a failure leaves the Triton kernels plain for the rest
        of the block, warned (never raised into the loop)."""
        twins = None
        try:
            from .kernels.twins import shared_twins

            twins = shared_twins()
            return action(twins)
        except Exception as exc:
            self.kernels = "recorded"
            warn(f"torch_l2topo: the Triton kernels' twins failed to {what} ({type(exc).__name__}: {exc}); this "
                 f"block's traces have CTA tracks only for kernels that record themselves")
            if twins is not None:
                with contextlib.suppress(Exception):
                    twins.swap_out()
            return None

    def _swap_twins_in(self) -> None:
        """Every loaded Triton kernel's twin in place for the cycle (kernels="triton")."""
        self.handler.triton_kernels = None
        if self.kernels == "triton" and self._recording:
            self.handler.triton_kernels = self._twins_do(
                "swap in", lambda twins: twins.swap_in({d: rec.recorder(d) for d in self._devices}))

    def _swap_twins_out(self) -> None:
        if self.kernels == "triton":
            self._twins_do("swap out", lambda twins: twins.swap_out())

    def start_trace(self) -> None:
        def start():
            self._start_recording()
            if self._recording:  # the warmup's records, or a graph's replayed between cycles (a launch: only if
                rec.reset_dirty()  # any), unless a held drain still has to take the earlier cycles' records
            self._swap_twins_in()
            self.handler.held.start_ns = time.time_ns()

        self._quietly("starting a cycle's CTA recording", start)
        super().start_trace()

    def stop_trace(self) -> None:
        self._swap_twins_out()
        super().stop_trace()

        def stop():
            if self._recording:
                self._recording = False
                self._recorded = True
                rec.set_profiling(False)

        self._quietly("stopping CTA recording", stop)


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
