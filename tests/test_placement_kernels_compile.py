"""The placement helpers without a GPU: in direct mode a kernel built on them compiles to a plain kernel (no
atomics, no plan loads, no timers: the instructions of the same kernel written without them); in the other
modes the Triton checksum kernel compiles for sm_90 at 1 and 4 warps with its atomics executed once per
program; the CUDA demo compiles without spills in every mode; the bounds the host and both backends share
agree; and the protocol's logic (shares, tail, stealing, queues, the last CTA's reset, statistics, the
bad-magic and wrong-mode errors) holds in Triton's interpreter.

On CI (CI=true) a missing nvcc or Triton is a failure, not a skip (as in test_kernel_sources.py).
"""
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from kernel_compile import nvcc, register_definitions, sm90_ptx, threads_that_may_run

ROOT = Path(__file__).resolve().parents[1]
ATOMIC = re.compile(r"^\s*(@!?%p\d+\s+)?(atom|red)\.")


def _checksum_ptx(num_warps: int, place: int = 1) -> str:
    from torch_l2topo.triton_kernels.placement_demo import checksum_kernel

    sig = dict(out_ptr="*i64", count_ptr="*i32", n_out="i32", plan_ptr="*i32", state_ptr="*i64", PLACE="constexpr")
    return sm90_ptx(checksum_kernel, sig, {"PLACE": place}, num_warps)


def _instructions(ptx: str) -> list:
    """The PTX instruction opcodes in order (no registers, labels, comments or debug info)."""
    return [m.group(1) for m in re.finditer(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.:]*)\s", ptx, re.M)
            if not m.group(1).startswith((".loc", ".file", ".reg", ".param"))]


# The same chase kernel with the helpers (direct mode) and without them: in direct mode the helpers must leave
# nothing behind but the kernel itself (issue: the direct mode once ran ~1,900 PTX lines and 49 registers
# where the plain kernel ran ~220 and 10, and cost 1-58% over it).
_CHASE_SRC = """
import triton
import triton.language as tl
from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start
from torch_l2topo.triton_kernels.protocol import chase


@triton.jit
def with_helpers(starts_ptr, ends_ptr, n_loads, plan_ptr, state_ptr, PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        p = tl.load(starts_ptr + item)
        for _ in range(n_loads):
            p = chase(p)
        tl.store(ends_ptr + item, p)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


@triton.jit
def without_helpers(starts_ptr, ends_ptr, n_loads):
    item = tl.program_id(0)
    p = tl.load(starts_ptr + item)
    for _ in range(n_loads):
        p = chase(p)
    tl.store(ends_ptr + item, p)
"""


def _chase_kernels(tmp_path):
    import importlib.util

    path = tmp_path / "chase_kernels.py"  # @triton.jit needs the source in a file
    path.write_text(_CHASE_SRC)
    spec = importlib.util.spec_from_file_location("chase_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("num_warps", [1, 4])
def test_direct_mode_compiles_to_the_plain_kernel(tmp_path, num_warps):
    pytest.importorskip("triton")
    from torch_l2topo.layout import PLACE_DIRECT

    mod = _chase_kernels(tmp_path)
    helped = sm90_ptx(mod.with_helpers, dict(starts_ptr="*i64", ends_ptr="*i64", n_loads="i32", plan_ptr="*i32",
                                         state_ptr="*i64", PLACE="constexpr"), {"PLACE": PLACE_DIRECT}, num_warps)
    plain = sm90_ptx(mod.without_helpers, dict(starts_ptr="*i64", ends_ptr="*i64", n_loads="i32"), {}, num_warps)
    for needle in ("atom.", "red.", "%smid", "%globaltimer", "bar.sync"):
        assert needle not in helped, needle
    # the plan and state pointers are never read: no load from params 3 and 4
    assert not re.search(r"ld\.param\.\w+\s+%\w+,\s*\[with_helpers_param_[34]\]", helped)
    # the instructions of the kernel written without the helpers, up to order and a duplicated epilogue: LLVM
    # unswitches the item loop (it runs once) and emits the final store on both sides of `n_loads < 1`
    ours, theirs = Counter(_instructions(helped)), Counter(_instructions(plain))
    assert not theirs - ours and set(ours) - set(theirs) <= {"bra.uni"}, (ours - theirs, theirs - ours)
    assert sum((ours - theirs).values()) <= 6, ours - theirs


def test_the_other_modes_are_not_compiled_in():
    shares, queues = _checksum_ptx(1, 1), _checksum_ptx(1, 2)
    # shares mode: no queue scan (the queues' packing shifts by 56); queues mode: no FINISHED reset (acq_rel)
    assert "acq_rel" in shares and "acq_rel" not in queues
    assert not re.search(r"shr\.\w+\s+%\w+,\s*%\w+,\s*56;", shares)
    assert re.search(r"shl\.b64\s+%\w+,\s*%\w+,\s*56;", queues)


@pytest.mark.parametrize("num_warps, place", [(1, 1), (4, 1), (4, 2)])
def test_triton_checksum_kernel_compiles_with_scalar_atomics(num_warps, place):
    ptx = _checksum_ptx(num_warps, place)
    for needle in ("atom.global", ".add.", "%smid", "%globaltimer"):
        assert needle in ptx, needle
    if place == 1:
        assert "atom.global.gpu.acq_rel.add" in ptx  # the FINISHED count orders every claim before the reset
    defs = register_definitions(ptx)
    atomics = [line for line in ptx.splitlines() if ATOMIC.match(line)]
    # shares: claims (share, tail, steal, in both inlined copies of plan_next), error flag, statistics,
    # FINISHED; queues: claims, error flag; and the kernel's own two adds
    assert len(atomics) >= (8 if place == 1 else 4), atomics
    for line in atomics:
        # Executed once per program: its predicate, evaluated for every thread (through the chain of operations
        # on %tid.x that defines it; Triton 3.6 writes `lane == 0 && tid < 32`, 3.9 `(tid & 31 | tid >> 5) == 0`,
        # conjoined with the branch condition where it predicates instead of branching), may hold on thread 0
        # only.
        pred = re.match(r"\s*@(%p\d+)\s", line)
        assert pred, f"unpredicated atomic runs on every thread: {line.strip()}"
        assert threads_that_may_run(pred.group(1), defs, 32 * num_warps) == [0], line.strip()


def test_the_once_per_program_check_evaluates_predicates_per_thread():
    """threads_that_may_run on hand-written PTX: each way the compilers write "thread 0" passes, also through a
    register written twice alike; a predicate that holds on one lane of every warp, on an unknown, or on a
    register whose two writes disagree, does not."""
    ptx = """
        mov.u32 %r1, %tid.x;
        and.b32 %r2, %r1, 31;
        setp.eq.b32 %p1, %r2, 0;
        bfe.u32 %r3, %r1, 5, 2;
        or.b32 %r4, %r3, %r2;
        setp.eq.b32 %p2, %r4, 0;
        setp.lt.u32 %p3, %r1, 32;
        and.pred %p4, %p1, %p3;
        ld.global.b32 %r5, [ %rd1 + 0 ];
        setp.eq.b32 %p5, %r5, 0;
        and.pred %p6, %p2, %p5;
        and.pred %p7, %p1, %p5;
        or.b32 %r6, %r2, %r3;
        or.b32 %r6, %r3, %r2;
        setp.eq.b32 %p8, %r6, 0;
        mov.u32 %r7, %r4;
        mov.u32 %r7, %r2;
        setp.eq.b32 %p9, %r7, 0;
    """
    defs = register_definitions(ptx)
    runs = {p: threads_that_may_run(p, defs, 128) for p in ("%p1", "%p2", "%p4", "%p5", "%p6", "%p7", "%p8", "%p9")}
    assert runs["%p2"] == runs["%p4"] == runs["%p6"] == runs["%p8"] == [0]
    assert runs["%p1"] == runs["%p7"] == [0, 32, 64, 96] and runs["%p5"] == list(range(128))
    assert runs["%p9"][:2] == [0, 32]  # where the two writes of %r7 disagree (thread 32 on), %p9 is unknown


def test_triton_atomic_results_are_broadcast_through_shared_memory():
    """With 4 warps each returned atomic value goes thread 0 -> st.shared -> bar.sync -> ld.shared: every
    thread sees the one claim's result (the comment in triton_kernels/placement.py cites this)."""
    lines = _checksum_ptx(4).splitlines()
    # the adds whose results are used: claims and FINISHED (Triton 3.6 writes atom, not red, for the unused
    # results of the statistics and the drained count, which need no broadcast)
    returning = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*@%p\d+\s+atom\.global[\w.]*\.add\.\w+\s+(%\w+),", line)
        if m and any(re.search(re.escape(m.group(1)) + r"\b", later.split(",", 1)[-1]) for later in lines[i + 1:]):
            returning.append(i)
    assert returning
    for i in returning:
        window = "\n".join(lines[i:i + 12])
        assert re.search(r"st\.shared.*\n(?:.*\n)*?\s*bar\.sync.*\n(?:.*\n)*?\s*ld\.shared", window), window


def test_cuda_placement_demo_compiles_for_sm90_without_spills_in_every_mode(tmp_path):
    out = subprocess.run([nvcc(), "-arch=sm_90", "-O3", "-Xptxas", "-v", "-I", str(ROOT / "cuda_ext"), "-c",
                          str(ROOT / "cuda_ext" / "placement_demo.cu"), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("Compiling entry function '_ZN6l2topo21placement_demo_kernelILi") == 3, out.stderr
    assert not re.search(r"[1-9]\d* bytes spill (stores|loads)", out.stderr), out.stderr
    # direct mode (template argument 0) has no barrier: no claim to broadcast
    direct = out.stderr.split("placement_demo_kernelILi0E")[1].split("Compiling entry")[0]
    assert "used 0 barriers" in direct or "barriers" not in direct, direct


def test_cuda_placement_demo_ptx_reads_cursors_from_l2_and_orders_the_reset(tmp_path):
    ptx = tmp_path / "k.ptx"
    out = subprocess.run([nvcc(), "-arch=sm_90", "-O3", "-I", str(ROOT / "cuda_ext"), "-ptx",
                          str(ROOT / "cuda_ext" / "placement_demo.cu"), "-o", str(ptx)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    text = ptx.read_text()
    assert "ld.relaxed.gpu" in text  # the steal scan's cursor reads bypass stale L1 lines
    assert re.search(r"atom\.(global\.)?add\.acq_rel\.gpu", text) or "atom.acq_rel.gpu" in text
    assert "%smid" in text and "%globaltimer" in text and "shfl.sync.bfly" in text


def test_device_api_is_the_same_in_both_backends():
    """The public @triton.jit functions of placement.py are the public device functions of placement.cuh
    (helpers: a leading _ in Triton, namespace detail in CUDA), as tests/test_kernel_sources.py checks for
    the probe protocol."""
    source = (ROOT / "triton_kernels" / "placement.py").read_text()
    triton_names = set(re.findall(r"@triton\.jit\ndef ([a-z]\w*)\(", source))
    header = re.sub(r"namespace detail \{.*?\}  // namespace detail", "",
                    (ROOT / "cuda_ext" / "placement.cuh").read_text(), flags=re.S)
    cuda_names = set(re.findall(r"__device__ [^(]*?\b([a-z]\w*)\(", header))
    assert triton_names == cuda_names == {"plan_start", "plan_next", "plan_finish"}


def test_the_usage_pattern_compiles_in_a_users_cuda_kernel(tmp_path):
    """The loop of placement.cuh's usage comment, in a user's kernel with a 2-D block, next to the probe
    protocol header."""
    src = tmp_path / "user.cu"
    src.write_text('''#include "protocol.cuh"
#include "placement.cuh"
template <int PLACE>
__global__ void user(const float* x, float* out, const int32_t* plan, int64_t* state) {
  const l2topo::PlanCta cta = l2topo::plan_start<PLACE>(plan, state);
  l2topo::PlanItem next = l2topo::plan_next<PLACE>(plan, state, cta.sm, 0);
  int64_t n_done = 0;
  while (next.item >= 0) {
    out[next.item * blockDim.x * blockDim.y + threadIdx.y * blockDim.x + threadIdx.x] = 2 * x[next.item];
    ++n_done;
    next = l2topo::plan_next<PLACE>(plan, state, cta.sm, next.phase);
  }
  l2topo::plan_finish<PLACE>(plan, state, cta.sm, cta.t0, n_done);
}
template __global__ void user<l2topo::PLACE_DIRECT>(const float*, float*, const int32_t*, int64_t*);
template __global__ void user<l2topo::PLACE_SHARES>(const float*, float*, const int32_t*, int64_t*);
template __global__ void user<l2topo::PLACE_QUEUES>(const float*, float*, const int32_t*, int64_t*);
''')
    out = subprocess.run([nvcc(), "-arch=sm_90", "-I", str(ROOT / "cuda_ext"), "-c", str(src), "-o",
                          str(tmp_path / "user.o")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_phases_agree_between_both_backends():
    pytest.importorskip("triton")
    from torch_l2topo.triton_kernels import placement

    cuda = dict(re.findall(r"constexpr int (\w+) = (\d+);", (ROOT / "cuda_ext" / "placement.cuh").read_text()))
    for name in ("PHASE_FIRST", "PHASE_SHARE", "PHASE_TAIL", "PHASE_STEAL", "PHASE_DONE", "PHASE_KIND_MASK",
                 "PHASE_COUNT_SHIFT"):
        assert getattr(placement, name).value == int(cuda[name]), name


# ---- the protocol in Triton's interpreter -------------------------------------------------------------------
# The interpreter runs programs one after another and has no inline asm: %smid and %globaltimer get stand-ins
# (program id modulo INTERP_SMS + 1, so one program in INTERP_SMS + 1 sits on an SM the plan does not know;
# a constant clock). Sequential programs cannot race, so this checks the logic, not the atomics: the GPU
# tests (tests/test_gpu_placement.py) check those. It runs in a subprocess because TRITON_INTERPRET must be set
# before any @triton.jit runs.
INTERP_SMS = 4
KNOWN_SMS = INTERP_SMS + 1  # %smid stand-in: program id modulo this
INTERP_CASES = [  # policy, n_items, grid, launches, the grid the plan is built for (make_plan's grid)
    ("weighted", 37, INTERP_SMS + 3, 2, INTERP_SMS + 3),  # programs on slots, one on an unknown SM, shares + tail
    ("uniform", 37, 2, 1, None),          # slots 2, 3 have no program: their shares are stolen
    ("uniform", 200, 37, 2, None),        # more programs than slots: several count on each SM's cursor
    ("dynamic", 1, 3, 1, None),
    ("uniform", 0, INTERP_SMS, 1, None),
    ("uniform", 37, 37, 2, 37),           # every item by program id: no claim, the state untouched
    ("uniform", 37, 10, 2, 10),           # one item each by program id, then shares, tail and stealing
    ("dynamic", 37, 5, 1, 20),            # a smaller grid than planned: programs take p, p + 5, ... by id, then claim
    ("uniform", 20, 30, 1, 30),           # more programs than items: programs 20.. take none, nothing to claim
    ("uniform", 37, 50, 1, 8),            # a larger grid than planned: programs 8.. take nothing by id, only claim
    ("partition_queues", 37, 37, 2, None),  # one program per item, classes spread over both sides' queues
    ("partition_queues", 37, 3, 1, None),   # fewer programs than items: they keep claiming until all is done
    ("plain", 37, 37, 2, None),
]


def _interpreter_main():
    global tl  # @triton.jit functions see module globals only
    import numpy as np
    import torch
    import triton
    import triton.language as tl

    from torch_l2topo import layout
    from torch_l2topo.placement.plans import POLICY_TABLE, SpeedModel, Workload, make_plan
    from torch_l2topo.triton_kernels import placement, placement_demo

    @triton.jit
    def stand_in_sm_id():
        return (tl.program_id(0) % KNOWN_SMS).to(tl.int64)

    @triton.jit
    def stand_in_ns():
        return tl.full((), 1000, tl.int64)

    placement.sm_id, placement.global_ns = stand_in_sm_id, stand_in_ns
    n_out = 5
    # two sides: SMs 0, 2 near partition 0, SMs 1, 3 near partition 1 (near 1, far 2, unknown home 1.5)
    side = np.arange(INTERP_SMS) % 2
    cost = np.full((INTERP_SMS, 3), 1.5)
    cost[np.arange(INTERP_SMS), side], cost[np.arange(INTERP_SMS), 1 - side] = 1.0, 2.0
    speeds = SpeedModel(cost, side, "interpreter")
    bad = [("corrupt", 37, INTERP_SMS, 1, None), ("wrong mode", 37, 4, 1, None)]
    for policy, n, grid, launches, plan_grid in INTERP_CASES + bad:
        built = {"corrupt": "weighted", "wrong mode": "partition_queues"}.get(policy, policy)
        plan = make_plan(built, speeds, Workload(n, np.arange(n) % 3), grid=plan_grid)
        words = torch.from_numpy(plan.to_array().copy())
        place = POLICY_TABLE[built].mode if policy != "wrong mode" else layout.PLACE_SHARES
        if policy == "corrupt":
            words[layout.PLAN_MAGIC] = 0
        state = torch.zeros(layout.state_words(INTERP_SMS), dtype=torch.int64)
        # nothing to claim: no program may touch the count (a stray value there would survive, or be reset)
        untouched = plan.mode == layout.PLACE_SHARES and n and plan.n_first == n
        state[layout.STATE_FINISHED] = -(2**40) if untouched else 0
        out, count = torch.zeros(n_out, dtype=torch.int64), torch.zeros(max(n, 1), dtype=torch.int32)
        for _ in range(launches):
            if plan.mode == layout.PLACE_QUEUES:  # what PlanSlot.prepare does before every launch
                state[layout.STATE_CURSORS:layout.STATE_CURSORS + plan.n_queues] = 0
            placement_demo.checksum_kernel[(grid,)](out, count, n_out, words, state, place)
        s = state.numpy()
        stats = s[layout.stat_offset(0, INTERP_SMS):].reshape(layout.N_STATS, INTERP_SMS)
        on_slots = sum(1 for pid in range(grid) if pid % KNOWN_SMS < INTERP_SMS)
        if untouched:
            assert s[layout.STATE_FINISHED] == -(2**40), (policy, s)
            s[layout.STATE_FINISHED] = 0
        fixed = s[:layout.STATE_CURSORS + INTERP_SMS]
        if policy in ("corrupt", "wrong mode"):
            assert count.sum() == 0 and out.sum() == 0, policy
            assert s[layout.STATE_ERROR] == 1 and stats.sum() == 0, s
            assert s[layout.STATE_TAIL] == 0 and s[layout.STATE_FINISHED] == 0, s
            continue
        assert (count.numpy()[:n] == launches).all(), (policy, count)
        assert (out.numpy() == launches * placement_demo.checksum_reference(n, n_out)).all(), policy
        if plan.mode == layout.PLACE_SHARES:
            assert not fixed.any(), (policy, fixed)  # the last program out left tail, count and cursors at zero
            assert plan.n_first == min(n, plan_grid or 0) if POLICY_TABLE[built].by_program else not plan.n_first
            assert stats[layout.STAT_CTAS].sum() == launches * on_slots, (policy, stats)
            assert stats[layout.STAT_ITEMS].sum() <= launches * n, (policy, stats)  # unknown SMs: not counted
            assert (stats[layout.STAT_BUSY_NS] == 0).all(), stats  # the stand-in clock stands still
        else:
            assert not stats.any() and not s[layout.STATE_ERROR], (policy, s)  # no statistics, no error
        if policy == "partition_queues" and grid == n:
            # sequential programs each claim from their SM's home queue first: program p (on SM p % 5; SM 4
            # is unknown and starts at queue 0) gets an item of its own side until that side runs out
            cursors = s[layout.STATE_CURSORS:layout.STATE_CURSORS + plan.n_queues]
            assert (cursors >= np.diff(plan.offsets)).all(), cursors  # every queue drained
    print("interpreter protocol ok")


def _major_minor(version: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def test_protocol_logic_in_the_triton_interpreter():
    import numpy as np

    triton = pytest.importorskip("triton")
    if _major_minor(triton.__version__) < (3, 7) and _major_minor(np.__version__) >= (2, 4):
        pytest.skip("Triton < 3.7's interpreter breaks with numpy >= 2.4 (tensor indices); Triton 3.9 runs it")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=600, env=env,
                         cwd=ROOT)
    assert out.returncode == 0 and "interpreter protocol ok" in out.stdout, out.stdout + out.stderr


if __name__ == "__main__":
    _interpreter_main()
