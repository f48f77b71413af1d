"""The probes' control block and output layouts, shared by both backends.

The control block is an int64 tensor: four counters, then one claim flag per SM slot. cuda_ext/probe_layout.h
mirrors these numbers for the CUDA backend; tests/test_kernel_sources.py checks that the two agree.
"""

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
OUT_WORDS = 3              # per-SM output words: cycles, ns, and (chain) end address / (lines) broken count


def control_words(capacity: int) -> int:
    """Length of the control block for `capacity` SM slots."""
    return CLAIMS + capacity
