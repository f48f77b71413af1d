// The probes' control block and output layouts: a mirror of torch_l2topo/probe_layout.py, which is the
// reference; tests/test_kernel_sources.py checks that every number here matches it.
#pragma once

namespace l2topo {

constexpr int ERROR = 0;          // first error code set by any CTA (0: none)
constexpr int ERROR_DETAIL = 1;   // what the failing CTA saw (SM id, arrivals, turn)
constexpr int ARRIVALS = 2;       // CTAs that claimed an SM and reached the start barrier
constexpr int TURN = 3;           // SMs done measuring; SM s starts once TURN >= (s / wave) * wave
constexpr int CLAIMS = 4;         // CLAIMS + sm: 1 once a CTA owns that SM

constexpr int ERR_SMID_RANGE = 1;       // %smid was >= the SM slot capacity
constexpr int ERR_BARRIER_TIMEOUT = 2;  // not every SM got a CTA within the watchdog timeout
constexpr int ERR_TURN_TIMEOUT = 3;     // the waves stopped moving

constexpr int POLL_BACKOFF_NS = 2000;  // sleep between polls of a waiting CTA (see probe_layout.py)

constexpr int LINE_BYTES = 128;
constexpr int LINE_WORDS = LINE_BYTES / 8;
constexpr int OUT_WORDS = 3;

}  // namespace l2topo
