"""What the compile-check tests share: the sm_90 PTX of a Triton kernel and the nvcc they compile CUDA with,
both without a GPU (a missing one is a skip here and a failure on CI, where CI=true), and a small def-use
reading of PTX that tells whether a predicate derives from the thread id."""
import os
import re
import shutil
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_DEFINITION = re.compile(r"\s*(?:@!?%p\d+\s+)?[a-z][\w.:]*\s+(%\w+)\s*(?:\|\s*%\w+)?\s*,(.*);")


def need(available: bool, what: str):
    if not available:
        if IN_CI:
            pytest.fail(f"{what} is missing on CI")
        pytest.skip(f"{what} not available here")


def nvcc() -> str:
    path = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    need(path is not None, "nvcc")
    return path


def triton_module():
    try:
        import triton
    except ImportError:
        need(False, "triton")
    return triton


def sm90_ptx(fn, signature: dict, constexprs: dict, num_warps: int = 1, attrs: dict = None,
             options: dict = None) -> str:
    """PTX of `fn` compiled for sm_90 at `num_warps` warps; `attrs` as ASTSource takes them; `options`: more
    compile options (debug, sanitize_overflow: what a launch passes as keyword arguments)."""
    triton = triton_module()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, **(options or {})}).asm["ptx"]


def register_definitions(ptx: str) -> dict:
    """register -> the instructions that write it (a register may be written more than once)."""
    defs = {}
    for line in ptx.splitlines():
        m = _DEFINITION.match(line)
        if m:
            defs.setdefault(m.group(1), []).append(line)
    return defs


def derives_from_thread_id(reg: str, defs: dict, seen: set = None) -> bool:
    """True if some write of `reg` derives (through any chain of instructions) from %tid.x."""
    seen = set() if seen is None else seen
    if reg in seen:
        return False
    seen.add(reg)
    for line in defs.get(reg, []):
        if "%tid.x" in line:
            return True
        if any(derives_from_thread_id(r, defs, seen) for r in re.findall(r"%\w+", line.split(",", 1)[1])):
            return True
    return False


_OPERATION = re.compile(r"\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+%\w+\s*,(.*);")


def _operand(token: str, defs: dict, tid: int, depth: int):
    token = token.strip()
    if token == "%tid.x":
        return tid
    if re.fullmatch(r"-?\d+", token):
        return int(token)
    return thread_value(token, defs, tid, depth + 1) if token.startswith("%") else None


def thread_value(reg: str, defs: dict, tid: int, depth: int = 0):
    """The value of `reg` in thread `tid` of the program (x only), where its definitions are chains of integer and
    predicate operations on %tid.x and constants; None where it depends on anything else (an unknown). PTX
    registers are not SSA: a register written in several places is known only where every write gives the same
    value (whichever reaches the use)."""
    writes = defs.get(reg, [])
    values = {_write_value(write, defs, tid, depth) for write in writes} if depth < 32 else {None}
    return values.pop() if len(values) == 1 else None


def _write_value(write: str, defs: dict, tid: int, depth: int):
    m = _OPERATION.match(write)
    if m is None:
        return None
    op, args = m.group(1), [_operand(a, defs, tid, depth) for a in m.group(2).split(",")]
    kind = op.split(".")
    if kind[0] == "and" and kind[-1] == "pred":  # a conjunction is false once either side is
        return False if False in args else (True if args == [True, True] else None)
    if None in args:
        return None
    ops = {"mov": lambda a: a[0], "and": lambda a: a[0] & a[1], "or": lambda a: a[0] | a[1],
           "shr": lambda a: a[0] >> a[1], "shl": lambda a: a[0] << a[1], "add": lambda a: a[0] + a[1],
           "bfe": lambda a: (a[0] >> a[1]) & ((1 << a[2]) - 1),
           "setp": lambda a: {"eq": a[0] == a[1], "ne": a[0] != a[1], "lt": a[0] < a[1], "le": a[0] <= a[1],
                              "gt": a[0] > a[1], "ge": a[0] >= a[1]}.get(kind[1])}
    return ops[kind[0]](args) if kind[0] in ops else None


def threads_that_may_run(pred: str, defs: dict, n_threads: int) -> list:
    """Threads of a program of n_threads whose `pred` is true or unknown (thread_value): those that may execute an
    instruction guarded by @pred."""
    return [t for t in range(n_threads) if thread_value(pred, defs, t) is not False]
