"""Memory layouts shared by the host and the kernels: the probes' control block, the placement modes, plan and
state, and the CTA recorder buffer. Each section below names its words.

Contract: this module imports nothing, so the kernel folders can depend on it alone (triton_kernels/*.py import
it as `torch_l2topo.layout`); cuda_ext/layout.h mirrors every number and tests/test_kernel_sources.py checks
that the two agree. Direction: layout <- kernels (triton_kernels/, cuda_ext/) <- launch <- probes <- calibration.

- Control block (int64): four counters, then one claim flag per SM slot.
- Plan (int32, read-only on the device): a header, then the mode's arrays (shares: per-SM CSR offsets, items,
  the dynamic tail; queues: home queues, queue offsets, items; direct: nothing, program p takes item p).
- State (int64): cursors, the tail, finished CTAs, then per-SM statistics. Shares mode: the last CTA out zeroes
  the cursors (no host reset, CUDA-graph safe); queues mode: the launcher's memset, captured with the launch.
- CTA recorder (int64): a cursor and the capacity, then one record per CTA (triton_kernels/recorder.py).

Docs: docs/usage.md ("Placing work").
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

# ---- placement modes: the PLACE constexpr a kernel built on the placement helpers is compiled with -------
# The launcher (placement/sm_aware.py) picks the mode per launch; a kernel is specialised per mode, so the
# helpers of the other modes are not in its machine code.
PLACE_DIRECT = 0     # one program per item, program p takes item p: the helpers compile to nothing (no plan
                     # loads, no atomics): the machine code of a kernel written without them
PLACE_SHARES = 1     # a persistent grid: each CTA takes its SM's share, then the tail, then steals
PLACE_QUEUES = 2     # a plain-sized grid: each program claims items of its SM's queue (its L2 partition's
                     # items), then of the other queues, a chunk per atomic
PLACE_MODE_MASK = 3
PLACE_RECORD = 4     # bit: profiling is on. plan_finish appends this CTA's record to the recorder the plan's
                     # header points at (PLAN_REC_*); without the bit none of it is compiled in

# ---- placement plan (int32, read-only on the device) --------------------------------------------------
PLAN_N_SLOTS = 0    # SM slots (the calibration's SM count)
PLAN_N_STATIC = 1   # items in the static shares (shares mode) or in the queues (queues mode)
PLAN_N_TAIL = 2     # items in the dynamic tail, taken by whichever CTA asks first (shares mode)
PLAN_MAGIC = 3      # PLAN_MAGIC_VALUE: a kernel handed anything else fails instead of guessing
PLAN_MODE = 4       # the PLACE_* mode the plan was built for; a kernel compiled for another mode refuses it
PLAN_N_QUEUES = 5   # queues mode: queues (groups x queues per group)
PLAN_GROUP_QUEUES = 6  # queues mode: queues per group (queue q belongs to group q // PLAN_GROUP_QUEUES)
PLAN_CHUNK = 7      # queues mode: items claimed per atomic
PLAN_REC_LO = 8     # the CTA recorder buffer's address, low and high 32 bits (PLACE_RECORD launches only)
PLAN_REC_HI = 9
PLAN_REC_TAG = 10   # this kernel's tag in that recorder
PLAN_N_FIRST = 11   # shares mode: items 0..n_first-1 are in no array: program p takes items p, p + grid, ... below
                    # n_first before any claim (uniform, dynamic: one per program of the grid the plan is built for)
PLAN_HEADER = 12    # shares mode: offsets[n_slots + 1] start here, then items[n_static], then tail[n_tail];
                    # queues mode: home queue of each SM slot [n_slots], queue offsets [n_queues + 1], items
PLAN_MAGIC_VALUE = 0x4C32504C  # "L2PL"
# Width of the device's steal scan and queue scan: every slot's (queue's) cursor is read in one vector. 256
# covers every NVIDIA GPU to date (H200: 132 SMs, B200: 148); the host refuses plans with more slots.
PLAN_MAX_SLOTS = 256
PLAN_MAX_QUEUES = 64  # queues mode: the scan of every queue's cursor is one vector this wide

# ---- CTA recorder buffer (int64) ---------------------------------------------------------------------
# One fixed buffer per GPU (measure/recording.py), written by kernels that record their CTAs: a header, then
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

# ---- placement state (int64) --------------------------------------------------------------------------
# Fixed words first, then cursor[s] at STATE_CURSORS + s, then per-SM statistics that accumulate across
# launches: statistic k of SM s at STATE_CURSORS + (1 + k) * n_slots + s.
STATE_TAIL = 0      # next tail item to hand out (bits 0-31) and shares drained (bits 32-62: a share counts once,
                    # at the claim of its last item, or the first claim of an empty one): the tail claim that
                    # fails also says whether any share is left, so a program on its way out skips the scan for a
                    # victim without another round trip once the count is n_slots
STATE_DRAINED_SHIFT = 32
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


def state_words(n_slots: int) -> int:
    """Length of a placement state tensor."""
    return STATE_CURSORS + (1 + N_STATS) * n_slots


def stat_offset(stat: int, n_slots: int) -> int:
    """Index of statistic `stat` of SM 0 in a placement state tensor."""
    return STATE_CURSORS + (1 + stat) * n_slots


def recorder_words(capacity: int) -> int:
    """Length of a CTA recorder buffer holding `capacity` records."""
    return REC_HEADER + capacity * REC_WORDS
