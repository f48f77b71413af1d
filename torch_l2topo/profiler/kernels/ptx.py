"""A Triton kernel's PTX with one CTA record written at its exit: the instrumented twin the profiler swaps in.

instrument(ptx, buffer_address, tag) returns the same kernel (same parameters, shared memory and threads, so
every launcher that ran the original runs the twin unchanged) that also appends one record per CTA to the
recorder buffer (layout.py REC_*: tag, %smid, linear block index, %globaltimer at entry and at exit, items 1,
near -1), reserved with one relaxed atomic that thread (0, 0, 0) issues at the entry and reads only at the
exit, where it writes the record: every `ret` and `exit` of the entry branches to one exit block. The
buffer's address is a constant of the twin, which is why a twin belongs to one buffer. Pure text: no GPU and
no Triton needed. Docs: docs/profiler.md (Whole-model profiling).
"""
from __future__ import annotations

import re

from ...errors import L2TopoError
from ...layout import (
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
)

PREFIX = "%l2t_"  # every register and label the instrumentation adds starts with this (or $L2T_)
_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s+([\w$]+)\s*\(", re.M)
_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.M)
# a return of the entry: `ret;`, `ret.uni;`, `exit;`, each possibly predicated
_RETURN = re.compile(r"^(\s*)(@!?%[\w$]+\s+)?(?:ret(?:\.uni)?|exit)\s*;", re.M)


class InstrumentationError(L2TopoError):
    """A kernel's PTX is not in a shape the CTA instrumentation can rewrite (no single entry, unbalanced body)."""


def kernel_name(ptx: str) -> str:
    """The name of the PTX module's one .entry."""
    names = _ENTRY.findall(ptx)
    if len(names) != 1:
        raise InstrumentationError(f"expected one .entry in the PTX, found {len(names)}")
    return names[0]


def target(ptx: str) -> str:
    """The module's .target architecture, e.g. "sm_90a" (what ptxas is given as --gpu-name)."""
    m = _TARGET.search(ptx)
    if not m:
        raise InstrumentationError("the PTX has no .target line")
    return m.group(1)


def _body(ptx: str) -> tuple:
    """(start, end): offsets just after the entry body's opening brace and at its closing brace."""
    kernel_name(ptx)
    m = _ENTRY.search(ptx)
    depth, start = 0, None
    for line in re.finditer(r"[^\n]*\n?", ptx[m.end():]):
        code = line.group(0).split("//", 1)[0]
        for i, ch in enumerate(code):
            if ch == "{":
                depth += 1
                if depth == 1 and start is None:
                    start = m.end() + line.start() + i + 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    return start, m.end() + line.start() + i
                if depth < 0:
                    break
    raise InstrumentationError("the entry's body braces do not balance")


def _entry_code(buffer_address: int) -> str:
    """At the entry: %smid and the start time for every thread; thread (0, 0, 0) (predicate p0 false) also reserves
    its record and loads the capacity. Nothing at the entry reads the atomic's result, so its latency (long while
    every CTA of a launch reserves on the one cursor) overlaps the kernel's work instead of stalling the exit."""
    r, rd, p = f"{PREFIX}r", f"{PREFIX}rd", f"{PREFIX}p"
    lines = [
        f".reg .pred {p}<2>;", f".reg .b32 {r}<8>;", f".reg .b64 {rd}<12>;",
        f"mov.u32 {r}0, %smid;", f"mov.u64 {rd}0, %globaltimer;",
        f"mov.u32 {r}1, %tid.x;", f"mov.u32 {r}2, %tid.y;", f"or.b32 {r}1, {r}1, {r}2;",
        f"mov.u32 {r}2, %tid.z;", f"or.b32 {r}1, {r}1, {r}2;",
        f"setp.ne.u32 {p}0, {r}1, 0;",
        f"mov.u64 {rd}2, {buffer_address};",
        f"@!{p}0 atom.relaxed.gpu.global.add.u64 {rd}3, [{rd}2+{8 * REC_CURSOR}], 1;",
        # the capacity's low word (little-endian; it stays far below 2**32, and only the host writes it): one
        # register live through the kernel, not two
        f"@!{p}0 ld.global.u32 {r}7, [{rd}2+{8 * REC_CAPACITY}];",
    ]
    return "\n" + "".join(f"\t{line}\n" for line in lines)


def _exit_code(buffer_address: int, tag: int) -> str:
    """At the exit: thread (0, 0, 0) writes its record where the entry reserved it (nothing past the capacity)."""
    r, rd, p = f"{PREFIX}r", f"{PREFIX}rd", f"{PREFIX}p"

    def word(index: int) -> int:  # byte offset, from the record's start, of one of its int64 words
        return 8 * index

    record = [
        f"cvt.u64.u32 {rd}4, {r}7;",
        f"setp.ge.u64 {p}1, {rd}3, {rd}4;",
        f"@{p}1 bra $L2T_done;",
        f"mov.u64 {rd}2, {buffer_address};",
        f"mad.lo.u64 {rd}5, {rd}3, {8 * REC_WORDS}, {rd}2;",
        f"add.u64 {rd}5, {rd}5, {8 * REC_HEADER};",
        f"mov.u64 {rd}6, {tag};",
        f"st.global.u64 [{rd}5+{word(REC_TAG)}], {rd}6;",
        f"cvt.u64.u32 {rd}6, {r}0;",
        f"st.global.u64 [{rd}5+{word(REC_SM)}], {rd}6;",
        # the linear block index, x fastest, as the Triton and CUDA recorders write it
        f"mov.u32 {r}3, %ctaid.z;", f"mov.u32 {r}4, %nctaid.y;", f"mov.u32 {r}5, %ctaid.y;",
        f"cvt.u64.u32 {rd}7, {r}3;", f"cvt.u64.u32 {rd}8, {r}4;", f"cvt.u64.u32 {rd}9, {r}5;",
        f"mad.lo.u64 {rd}7, {rd}7, {rd}8, {rd}9;",
        f"mov.u32 {r}3, %nctaid.x;", f"mov.u32 {r}4, %ctaid.x;",
        f"cvt.u64.u32 {rd}8, {r}3;", f"cvt.u64.u32 {rd}9, {r}4;",
        f"mad.lo.u64 {rd}7, {rd}7, {rd}8, {rd}9;",
        f"st.global.u64 [{rd}5+{word(REC_PROGRAM)}], {rd}7;",
        f"st.global.u64 [{rd}5+{word(REC_START_NS)}], {rd}0;",
        f"st.global.u64 [{rd}5+{word(REC_END_NS)}], {rd}1;",
        f"mov.u64 {rd}10, 1;",
        f"st.global.u64 [{rd}5+{word(REC_ITEMS)}], {rd}10;",
        f"mov.u64 {rd}10, -1;",
        f"st.global.u64 [{rd}5+{word(REC_NEAR)}], {rd}10;",
    ]
    lines = [
        "$L2T_exit:",
        f"@{p}0 bra $L2T_done;",
        f"mov.u64 {rd}1, %globaltimer;",
        *record,
        "$L2T_done:",
        "ret;",
    ]
    return "".join(f"\t{line}\n" if not line.endswith(":") else f"{line}\n" for line in lines)


def instrument(ptx: str, buffer_address: int, tag: int) -> str:
    """The PTX of `ptx`'s kernel recording one CTA record per block into the recorder buffer at
    `buffer_address` under `tag` (module docstring).

    Raises:
        ValueError: the address or tag is not a non-negative 64-bit integer (the address nonzero).
        InstrumentationError: the PTX has no single entry, its body does not balance, it has no return, or
            it already carries this instrumentation.
    """
    for name, value, low in (("buffer_address", buffer_address, 1), ("tag", tag, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2 ** 63:
            raise ValueError(f"{name} must be an integer in [{low}, 2**63), got {value!r}")
    if PREFIX in ptx or "$L2T_" in ptx:
        raise InstrumentationError("the PTX is already instrumented")
    start, end = _body(ptx)
    body = ptx[start:end]
    body, returns = _RETURN.subn(lambda m: f"{m.group(1)}{m.group(2) or ''}bra $L2T_exit;", body)
    if not returns:
        raise InstrumentationError("the entry has no ret or exit to record at")
    return ptx[:start] + _entry_code(buffer_address) + body + _exit_code(buffer_address, tag) + ptx[end:]
