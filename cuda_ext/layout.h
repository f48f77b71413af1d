// Memory layouts shared by the host and the kernels: a mirror of torch_l2topo/layout.py, which is the
// reference (it documents each word); tests/test_kernel_sources.py checks that every number here matches it.
#pragma once

namespace l2topo {

// ---- probe control block (int64) ----
constexpr int ERROR = 0;
constexpr int ERROR_DETAIL = 1;
constexpr int ARRIVALS = 2;
constexpr int TURN = 3;
constexpr int CLAIMS = 4;

constexpr int ERR_SMID_RANGE = 1;
constexpr int ERR_BARRIER_TIMEOUT = 2;
constexpr int ERR_TURN_TIMEOUT = 3;

constexpr int POLL_BACKOFF_NS = 2000;

constexpr int LINE_BYTES = 128;
constexpr int LINE_WORDS = LINE_BYTES / 8;
constexpr int OUT_WORDS = 4;

// ---- placement modes (a kernel's PLACE template parameter) ----
constexpr int PLACE_DIRECT = 0;
constexpr int PLACE_SHARES = 1;
constexpr int PLACE_QUEUES = 2;
constexpr int PLACE_MODE_MASK = 3;
constexpr int PLACE_RECORD = 4;

// ---- CTA recorder buffer (int64) ----
constexpr int REC_CURSOR = 0;
constexpr int REC_CAPACITY = 1;
constexpr int REC_HEADER = 2;
constexpr int REC_TAG = 0;
constexpr int REC_SM = 1;
constexpr int REC_PROGRAM = 2;
constexpr int REC_START_NS = 3;
constexpr int REC_END_NS = 4;
constexpr int REC_ITEMS = 5;
constexpr int REC_NEAR = 6;
constexpr int REC_WORDS = 7;

// ---- placement plan (int32) ----
constexpr int PLAN_N_SLOTS = 0;
constexpr int PLAN_N_STATIC = 1;
constexpr int PLAN_N_TAIL = 2;
constexpr int PLAN_MAGIC = 3;
constexpr int PLAN_MODE = 4;
constexpr int PLAN_N_QUEUES = 5;
constexpr int PLAN_GROUP_QUEUES = 6;
constexpr int PLAN_CHUNK = 7;
constexpr int PLAN_REC_LO = 8;
constexpr int PLAN_REC_HI = 9;
constexpr int PLAN_REC_TAG = 10;
constexpr int PLAN_N_FIRST = 11;
constexpr int PLAN_HEADER = 12;
constexpr int PLAN_MAGIC_VALUE = 0x4C32504C;
constexpr int PLAN_MAX_SLOTS = 256;
constexpr int PLAN_MAX_QUEUES = 64;

// ---- placement state (int64) ----
constexpr int STATE_TAIL = 0;
constexpr int STATE_DRAINED_SHIFT = 32;
constexpr int STATE_FINISHED = 1;
constexpr int STATE_ERROR = 2;
constexpr int STATE_CURSORS = 3;
constexpr int STAT_ITEMS = 0;
constexpr int STAT_BUSY_NS = 1;
constexpr int STAT_CTAS = 2;
constexpr int N_STATS = 3;

}  // namespace l2topo
