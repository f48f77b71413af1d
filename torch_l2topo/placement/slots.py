"""The host side of placement: plan tensors at fixed addresses and their statistics.

Owns PlanSlot (one device's int32 plan tensor and int64 state tensor, in layout.py's formats, for kernels
built on triton_kernels/placement.py or cuda_ext/placement.cuh). Plans themselves come from plans.py;
launching is launch.py's; the choice of a plan per workload is sm_aware.py's; a plan is only built from a
calibration of the device it runs on (measure/calibration.py's calibration_for).

Fixed addresses are what makes CUDA graphs work: a captured launch keeps reading the tensors it was captured
with, so a plan is written into its slot's tensor (never into a new one) outside capture, and the kernels
leave the state zeroed on exit (the last CTA out resets it), so replays need no host work (FlashInfer's
plan()/run() split, Inductor's ZERO_PER_GRAPH convention).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PlacementError
from ..layout import (
    N_STATS,
    PLACE_QUEUES,
    PLAN_MAX_SLOTS,
    PLAN_REC_LO,
    PLAN_REC_TAG,
    STAT_BUSY_NS,
    STAT_CTAS,
    STAT_ITEMS,
    STATE_CURSORS,
    STATE_ERROR,
    stat_offset,
    state_words,
)

# The device helpers scan every slot's cursor in one PLAN_MAX_SLOTS-wide vector: larger plans are refused
# here rather than having their extra slots never stolen from.
MAX_SLOTS = PLAN_MAX_SLOTS

CAPTURE_MESSAGE = ("a placement plan cannot be built or loaded during CUDA graph capture; launch the kernel once "
                   "with this workload before capturing")


def plan_capacity(capacity: int, needed: int, capturing: bool) -> int:
    """Words the plan tensor must have for a plan of `needed` words, given its `capacity` (0: none yet).

    Returns `capacity` when the plan fits (the tensor, and so its address, stays), else `needed` (a new
    tensor). During capture nothing may be loaded at all: a captured host-to-device copy would replay from a
    host buffer that is gone by then, and a new tensor would come from the graph's private pool.
    """
    if capturing:
        raise PlacementError(CAPTURE_MESSAGE)
    return capacity if needed <= capacity else needed


def _stats_dict(words: np.ndarray) -> dict:
    return {"items": words[STAT_ITEMS], "busy_ns": words[STAT_BUSY_NS], "ctas": words[STAT_CTAS]}


@dataclass
class StatsSnapshot:
    """Per-SM statistics on their way to the host: a pinned buffer filled by a copy queued on the stream, and
    the event recorded after it. Read stats() only once ready() is true; polling ready() never blocks."""

    buffer: object  # torch.Tensor (N_STATS, n_slots) int64, pinned
    event: object   # torch.cuda.Event

    def ready(self) -> bool:
        return self.event.query()

    def stats(self) -> dict:
        if not self.ready():
            raise PlacementError("the statistics copy has not completed yet: poll ready() first")
        return _stats_dict(self.buffer.numpy().copy())


class PlanSlot:
    """An int32 plan tensor and an int64 state tensor on `device`, for plans of `n_slots` SM slots.

    `plan` (allocated by the first load(), grown only when a bigger plan arrives) and `state` (zeroed once
    here) are what a kernel gets as plan_ptr and state_ptr. The state's statistics accumulate over every
    launch that used this slot.
    """

    def __init__(self, device, n_slots: int):
        import torch

        if not 1 <= n_slots <= MAX_SLOTS:
            raise PlacementError(f"a plan needs 1..{MAX_SLOTS} SM slots, got {n_slots}")
        self.device = torch.device(device)
        self.n_slots = int(n_slots)
        with torch.cuda.device(self.device):
            if torch.cuda.is_current_stream_capturing():
                raise PlacementError(CAPTURE_MESSAGE)
            self.state = torch.zeros(state_words(self.n_slots), dtype=torch.int64, device=self.device)
        self.plan = None
        self.loaded = None  # the plans.Plan last loaded
        self._cursors = None  # queues mode: the state's queue cursors, zeroed before every launch
        self.recorder = None  # (id of the CtaRecorder, tag) the plan's header points at
        self._pinned = None  # the host buffer of snapshot(), allocated once: pinning memory is slow

    def load(self, plan) -> None:
        """Write `plan` (a plans.Plan of n_slots slots) into the plan tensor and clear the error flag.

        Both are queued on the current stream: launches queued on it earlier still read the previous plan,
        later ones the new one. Launch the kernels of this slot on one stream; the slot does not order
        launches across streams.
        """
        import torch

        if plan.n_slots != self.n_slots:
            raise PlacementError(f"the plan has {plan.n_slots} SM slots but this slot holds plans of {self.n_slots}")
        words = plan.to_array()
        with torch.cuda.device(self.device):
            capacity = 0 if self.plan is None else self.plan.numel()
            wanted = plan_capacity(capacity, words.size, torch.cuda.is_current_stream_capturing())
            if wanted != capacity:
                self.plan = torch.empty(wanted, dtype=torch.int32, device=self.device)
            # Pinned source + non_blocking: a stream-ordered copy that does not stall the host; torch's pinned
            # allocator keeps the buffer until the copy has run.
            self.plan[:words.size].copy_(torch.from_numpy(words).pin_memory(), non_blocking=True)
            self.state[STATE_ERROR].zero_()
        self.loaded = plan
        # the view prepare() zeroes, made once: slicing on every launch cost the host more than the fill itself
        self._cursors = self.state[STATE_CURSORS:STATE_CURSORS + plan.n_queues] if plan.mode == PLACE_QUEUES else None
        self.recorder = None  # the new plan's header points at no recorder

    def attach_recorder(self, recorder, tag: int) -> None:
        """Point the plan's header at a CTA recorder (measure/recording.py) and this kernel's tag in it, for
        launches with the PLACE_RECORD bit: three int32 words, queued on the current stream; not during capture
        (a captured copy would replay from a host buffer that is gone by then)."""
        import torch

        if torch.cuda.is_current_stream_capturing():
            raise PlacementError(CAPTURE_MESSAGE)
        address = int(recorder.address)
        words = np.array([address & 0xFFFFFFFF, address >> 32, tag], dtype=np.uint32).view(np.int32)
        with torch.cuda.device(self.device):
            self.plan[PLAN_REC_LO:PLAN_REC_TAG + 1].copy_(torch.from_numpy(words).pin_memory(), non_blocking=True)
        self.recorder = (id(recorder), tag)

    def prepare(self) -> None:
        """What a launch of the loaded plan needs first: in queues mode the queue cursors zeroed (a memset queued
        on the current stream, captured with the kernel in a CUDA graph); nothing in the other modes (shares
        mode's last CTA resets its own state, direct mode has none)."""
        if self._cursors is not None:
            self._cursors.zero_()

    def _stat_words(self):
        start = stat_offset(0, self.n_slots)
        return self.state[start:start + N_STATS * self.n_slots].view(N_STATS, self.n_slots)

    def stats(self) -> dict:
        """Per-SM statistics accumulated since this slot was created: items, busy_ns, ctas ((n_slots,) int64
        each). A host read: it synchronizes with the current stream (waits for every launch queued so far)."""
        return _stats_dict(self._stat_words().cpu().numpy())

    def snapshot(self) -> StatsSnapshot:
        """The statistics as of the launches queued so far, copied without blocking (see StatsSnapshot). One
        snapshot at a time: the next one reuses the same host buffer."""
        import torch

        with torch.cuda.device(self.device):
            if self._pinned is None:
                self._pinned = torch.empty((N_STATS, self.n_slots), dtype=torch.int64, pin_memory=True)
            self._pinned.copy_(self._stat_words(), non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        return StatsSnapshot(self._pinned, event)

    def error(self) -> bool:
        """True if a launch since the last load() was handed a plan without the magic word (a corrupted or
        foreign plan tensor: its CTAs did no work). A host read: it synchronizes like stats()."""
        return bool(self.state[STATE_ERROR].item())
