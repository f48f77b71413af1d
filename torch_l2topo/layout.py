"""Memory layouts shared by the host and the kernels: the probes' control block and the placement plan.

This module imports nothing else of torch_l2topo (and nothing beyond the standard library), so that the
kernel folders can depend on it alone: triton_kernels/*.py import it as `torch_l2topo.layout`, and
cuda_ext/layout.h mirrors every number (tests/test_kernel_sources.py checks that the two agree).
Dependency direction: layout <- kernels (triton_kernels/, cuda_ext/) <- launch <- probes <- calibration.

Control block (int64): four counters, then one claim flag per SM slot.
CTA recorder (int64): a cursor and the capacity, then one record per CTA (profiler/, placement policy
"measured"); triton_kernels/recorder.py appends them.
Placement plan (int32, read-only on the device): a header, per-SM offsets into a flat item list (CSR),
the items, then the dynamic tail. A plan in direct mode hands program p item p and nothing else (policy
"plain": one program per item, placed by the hardware, no claims). Placement state (int64, zero at rest):
per-SM cursors, the tail cursor, the count of finished CTAs (the last CTA out zeroes the cursors, so launches
need no host reset and can be captured in CUDA graphs), then per-SM statistics that accumulate across launches.
"""

# ---- probe control block ------------------------------------------------------------------------------
ERROR = 0          # first error code set by any program (0: none)
ERROR_DETAIL = 1   # what the failing program saw (SM id, arrivals, turn)
ARRIVALS = 2       # programs that claimed an SM and reached the start barrier
TURN = 3           # SMs done measuring; SM s starts once TURN >= (s // wave) * wave
CLAIMS = 4         # CLAIMS + sm: 1 once a program owns that SM

ERR_SMID_RANGE = 1       # %smid was >= the SM slot capacity
ERR_BARRIER_TIMEOUT = 2  # not every SM got a program within the watchdog timeout
ERR_TURN_TIMEOUT = 3     # the waves stopped moving

# Waiting CTAs sleep this long between polls: without it, 131 SMs polling one control word keep its L2
# slice busy and disturb the SM that is measuring (seen on the H200 in serialized mode).
POLL_BACKOFF_NS = 2000

LINE_BYTES = 128           # an L2 line (four 32-byte sectors)
LINE_WORDS = LINE_BYTES // 8  # int64 words per line: pointers are stored in the first word of a line
OUT_WORDS = 4              # per-SM output words: cycles, ns, (chain) end address / (lines) broken count, start ns

# ---- CTA recorder buffer (int64) ---------------------------------------------------------------------
# One fixed buffer per GPU (placement/recording.py), written by kernels that record their CTAs: a header, then
# REC_WORDS words per record. A CTA reserves its record with one atomic on the cursor; the cursor keeps
# counting past the capacity, so the host reads dropped records as cursor - capacity without a second counter.
REC_CURSOR = 0     # records reserved so far (may exceed REC_CAPACITY: the excess was dropped)
REC_CAPACITY = 1   # records the buffer holds, written by the host when it allocates the buffer
REC_HEADER = 2     # record r occupies words REC_HEADER + r * REC_WORDS onwards
REC_TAG = 0        # which kernel: the tag CtaRecorder.register() gave its name
REC_SM = 1         # %smid of the SM that ran the CTA
REC_PROGRAM = 2    # program id (Triton program_id(0); CUDA: the linear block index)
REC_START_NS = 3   # %globaltimer when the CTA started its work
REC_END_NS = 4     # %globaltimer when the CTA wrote its record
REC_ITEMS = 5      # work items the CTA did
REC_NEAR = 6       # of those, items whose data is homed in the SM's own L2 partition; -1: not known
REC_WORDS = 7

# ---- placement plan (int32) ---------------------------------------------------------------------------
PLAN_N_SLOTS = 0    # SM slots with a static share (the calibration's SM count)
PLAN_N_STATIC = 1   # items in the static shares
PLAN_N_TAIL = 2     # items in the dynamic tail, taken by whichever CTA asks first
PLAN_MAGIC = 3      # PLAN_MAGIC_VALUE: a kernel handed anything else fails instead of guessing
PLAN_MODE = 4       # PLAN_MODE_SHARES or PLAN_MODE_DIRECT
PLAN_HEADER = 5     # offsets[n_slots + 1] start here, then items[n_static], then tail[n_tail]
PLAN_MAGIC_VALUE = 0x4C32504C  # "L2PL"
PLAN_MODE_SHARES = 0  # shares, tail and stealing, claimed with atomics (every policy but "plain")
PLAN_MODE_DIRECT = 1  # program p takes item p if p < n_tail, then stops: no atomics, no statistics, no reset
# Width of the device's steal scan: every slot's cursor is read in one vector. 256 covers every NVIDIA GPU to
# date (H200: 132 SMs, B200: 148); the host refuses plans with more slots.
PLAN_MAX_SLOTS = 256

# ---- placement state (int64) --------------------------------------------------------------------------
# Fixed words first, then cursor[s] at STATE_CURSORS + s, then per-SM statistics that accumulate across
# launches: statistic k of SM s at STATE_CURSORS + (1 + k) * n_slots + s.
STATE_TAIL = 0      # next tail item to hand out
STATE_FINISHED = 1  # CTAs that finished this launch; the last one zeroes cursors, tail and this count
STATE_ERROR = 2     # set when a kernel was handed a plan without PLAN_MAGIC_VALUE
STATE_CURSORS = 3
STAT_ITEMS = 0      # items done by the CTAs on SM s
STAT_BUSY_NS = 1    # %globaltimer ns those CTAs spent from start to finish, summed
STAT_CTAS = 2       # CTAs that ran on SM s
N_STATS = 3


def control_words(capacity: int) -> int:
    """Length of the control block for `capacity` SM slots."""
    return CLAIMS + capacity


def plan_words(n_slots: int, n_static: int, n_tail: int) -> int:
    """Length of a plan tensor."""
    return PLAN_HEADER + n_slots + 1 + n_static + n_tail


def state_words(n_slots: int) -> int:
    """Length of a placement state tensor."""
    return STATE_CURSORS + (1 + N_STATS) * n_slots


def stat_offset(stat: int, n_slots: int) -> int:
    """Index of statistic `stat` of SM 0 in a placement state tensor."""
    return STATE_CURSORS + (1 + stat) * n_slots


def recorder_words(capacity: int) -> int:
    """Length of a CTA recorder buffer holding `capacity` records."""
    return REC_HEADER + capacity * REC_WORDS
