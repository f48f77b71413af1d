"""Reading and writing PyTorch profiler (Kineto) traces: JSON or gzipped JSON, checked on the way in, written
atomically on the way out, and the events this package adds told apart from the profiler's own.

A Kineto trace is a JSON object with a "traceEvents" list and Kineto's top-level keys (schemaVersion,
baseTimeNanoseconds). GPU kernels are {"ph": "X", "cat": "kernel", "pid": <device>, "tid": <stream>, "ts",
"dur"} with ts and dur in microseconds. What this package adds lives in its own processes (pids from
L2MAP_PID, far above any OS pid and Kineto's small device pids), under categories starting with
"l2topo", plus the top-level key METADATA_KEY; strip() removes exactly that, so enriching twice gives the
same trace as enriching once.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from pathlib import Path

from ...errors import TraceFormatError
from ...files import atomic_write

METADATA_KEY = "l2topo"
# "L2" in ASCII, shifted: above Linux's largest pid (2**22) and below 2**31; one process per GPU (+ index).
L2MAP_PID = 0x4C32 << 16
MAX_DEVICES = 256
KINETO_KEYS = ("schemaVersion", "baseTimeNanoseconds")
GZIP_LEVEL = 6  # zlib's default: close to the best ratio at a fraction of level 9's time
_EVENTS_KEY = re.compile(r'"traceEvents"\s*:\s*\[')


def is_gzip(path) -> bool:
    return str(path).endswith(".gz")


def read_text(path) -> str:
    """The JSON text of the trace file at `path` (.json, or gzip whatever its name)."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (EOFError, OSError, zlib.error) as exc:
        raise TraceFormatError(f"{path} is a damaged or truncated gzip file ({exc})") from None
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise TraceFormatError(f"{path} is not a JSON trace (binary content)") from None


def parse(text: str, source: str) -> tuple:
    """(trace, end): the Kineto trace in `text` and the offset just past its top-level traceEvents array (where
    splice() appends), or -1 where that array could not be located in the text (a key written with escapes):
    splice() then does not apply. The array, nearly all of a trace, is parsed once; TraceFormatError for
    anything else."""
    try:
        at = _EVENTS_KEY.search(text)
        if at is not None:
            events, end = json.JSONDecoder().raw_decode(text, at.end() - 1)
            # the first match must be the top-level key, not one inside an earlier value: the rest of the text,
            # with a marker in place of the array, must give the marker back as the top-level traceEvents
            marker = f"l2topo-events-{os.urandom(8).hex()}"
            trace = json.loads(f'{text[:at.end() - 1]}"{marker}"{text[end:]}')
            if isinstance(trace, dict) and trace.get("traceEvents") == marker:
                trace["traceEvents"] = events
            else:
                at = None
        if at is None:
            trace, end = json.loads(text), -1
    except json.JSONDecodeError as exc:
        # a file cut short fails where its text ends (even right after an event's closing brace), or does not
        # end with the closing brace of a whole JSON object
        body = text.rstrip()
        cut = exc.pos >= len(body) or not body.endswith("}")
        where = "the file ends early: truncated" if cut else f"line {exc.lineno} column {exc.colno}"
        raise TraceFormatError(f"{source} is not valid JSON ({exc.msg}; {where})") from None
    check_kineto(trace, source)
    return trace, end


def load_trace(path) -> dict:
    """The trace at `path` (.json or .json.gz) as a dict; TraceFormatError naming the problem for a
    truncated, malformed or non-Kineto file (FileNotFoundError for a missing one)."""
    return parse(read_text(path), str(path))[0]


def splice(text: str, end: int, fragments: list, metadata: dict) -> bytes:
    """`text` (a trace and parse()'s `end`) with `fragments` (JSON text of events, comma-separated, as bytes)
    appended to its traceEvents and `metadata` under METADATA_KEY, as bytes, leaving the profiler's own text
    as it was: no second serialization of its events, and the added text copied once."""
    if end < 0:
        raise ValueError("splice() needs the end of the top-level traceEvents array (parse() found none)")
    close = end - 1  # the array's "]"
    head, tail = text[:close], text[close:]
    added = [f for f in fragments if f]
    joiner = b"," if added and head.rstrip()[-1] != "[" else b""
    last = tail.rfind("}")  # the top-level object's closing brace
    return b"".join([head.encode(), joiner, b",".join(added), tail[:last].encode(),
                     f',"{METADATA_KEY}":'.encode(), dumps(metadata), tail[last:].encode()])


def check_kineto(trace, source: str) -> None:
    """Raise TraceFormatError unless `trace` looks like a Kineto trace whose X events carry numeric times."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceFormatError(f"{source} is not a Chrome trace object with a traceEvents list")
    if not any(k in trace for k in KINETO_KEYS):
        raise TraceFormatError(f"{source} is a Chrome trace but not a PyTorch profiler (Kineto) trace: it has none "
                               f"of {', '.join(KINETO_KEYS)}")
    for i, ev in enumerate(trace["traceEvents"]):
        if not isinstance(ev, dict) or "ph" not in ev:
            raise TraceFormatError(f"{source}: traceEvents[{i}] is not an event (no 'ph')")
        if ev["ph"] == "X" and not all(isinstance(ev.get(k), (int, float)) for k in ("ts", "dur")):
            raise TraceFormatError(f"{source}: traceEvents[{i}] ({ev.get('name', '?')!r}) has no numeric ts/dur")


def dumps(trace: dict) -> bytes:
    # compact separators: about a third smaller than json.dump's defaults, and what Kineto writes
    return json.dumps(trace, separators=(",", ":")).encode()


def write_trace(trace, path) -> Path:
    """Write `trace` (a dict, or its JSON text as str or bytes) atomically to `path`, gzipped when the name ends
    in .gz."""
    data = trace.encode() if isinstance(trace, str) else trace if isinstance(trace, bytes) else dumps(trace)
    if is_gzip(path):
        data = gzip.compress(data, compresslevel=GZIP_LEVEL)
    # not durable: the trace workers write while the training loop runs, and an fsync held up the loop's own
    # export behind the filesystem's journal (docs/results.md, Profiler)
    return atomic_write(Path(path), data, durable=False)


def is_ours(ev: dict) -> bool:
    """Whether an event was added by this package (its processes, its categories)."""
    pid = ev.get("pid")
    return (isinstance(pid, int) and L2MAP_PID <= pid < L2MAP_PID + MAX_DEVICES) or \
        str(ev.get("cat", "")).startswith("l2topo")


def strip(trace: dict) -> dict:
    """A shallow copy of `trace` without anything this package added."""
    out = {k: v for k, v in trace.items() if k != METADATA_KEY}
    out["traceEvents"] = [ev for ev in trace["traceEvents"] if not is_ours(ev)]
    return out
