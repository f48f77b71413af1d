"""Read-only data replicated per L2 partition: does the latency an SM saves on its own partition's copy survive
the extra indexing? (the placement issue's "placement of read-only data" experiment)

The workload is latency-bound on purpose (one single-warp program per SM, each step a dependent load of a
256-byte row: a walk through a read-only linked table, like a tree or hash-chain lookup). Four layouts of
the same walk over the same rows, each checked against the host's expected end row:

- single_pointer: one table; each row holds the address of the next row.
- replicated_pointer: one copy of the table per partition, every row of copy p in a block homed in p, each
  copy's pointers pointing into the same copy. An SM walks the copy of its own partition (one lookup of its
  partition per program). No extra indexing: possible where the data's own links can be rewritten.
- single_index: one table; each row holds the index of the next row (address = base + index * 256).
- replicated_index: copies as above, rows addressed by index through a translation table where[p][index]
  (int32, loaded through L1): the layout any externally indexed table (an embedding) would need.

Blocks and SMs are labelled by the calibration (partition_map homes, sm_labels partitions), so "its own
partition" is near by measurement, not by assumption.

    python benchmarks/bench_replication.py --device 0 --out benchmarks/results/replication/replication_h200.json
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl
from bench_placement import timed
from common import calibrated_device, gpu_parser, quantile_rows, write_result

from torch_l2topo.triton_kernels.protocol import chase, sm_id

ROW_BYTES = 256      # one partition block
ROW_WORDS = ROW_BYTES // 8
TABLE_MB = (4, 8, 16)
STEPS = 2048         # dependent loads per walk
WALKS_PER_PROGRAM = 8  # walks each program does one after the other
CTAS_PER_SM = (1, 8)  # latency-bound, and eight walks in flight per SM


@triton.jit
def walk_pointer_kernel(starts_ptr, sm_part_ptr, ends_ptr, n_walks, steps, REPLICATED: tl.constexpr):
    """Walk w starts at starts[w, copy] (copy 0 without replicas) and follows row word 0 (an address)."""
    copy = 0
    if REPLICATED:
        copy = tl.load(sm_part_ptr + sm_id())
    for w in range(tl.program_id(0), n_walks, tl.num_programs(0)):
        p = tl.load(starts_ptr + w * 2 + copy)
        for _ in range(steps):
            p = chase(p)
        tl.store(ends_ptr + w, p)


@triton.jit
def walk_index_kernel(base_ptr, where_ptr, starts_ptr, sm_part_ptr, ends_ptr, n_rows, n_walks, steps,
                      REPLICATED: tl.constexpr):
    """Walk w starts at row starts[w] and follows row word 0 (a row index); replicated: row r of this SM's
    copy is at position where[copy, r] of the buffer."""
    base = base_ptr.to(tl.int64, bitcast=True)
    copy = 0
    if REPLICATED:
        copy = tl.load(sm_part_ptr + sm_id())
    for w in range(tl.program_id(0), n_walks, tl.num_programs(0)):
        r = tl.load(starts_ptr + w)
        for _ in range(steps):
            pos = r
            if REPLICATED:
                pos = tl.load(where_ptr + copy * n_rows + r).to(tl.int64)
            r = chase(base + pos * 256)
        tl.store(ends_ptr + w, r)


class Tables:
    """One random ring through n_rows rows, laid out once as a single table and once as a copy per partition
    (in one buffer mapped by partition_map: copying a buffer elsewhere would change its homes, so both the
    pointer and the index layouts are written into these same two buffers, one after the other)."""

    def __init__(self, dev, topo, table_bytes: int, n_walks: int, seed: int = 0):
        import torch

        from torch_l2topo.analysis.labels import sm_labels
        from torch_l2topo.placement.partition.maps import partition_map

        self.dev, self.n_rows = dev, table_bytes // ROW_BYTES
        n = self.n_rows
        rng = np.random.default_rng(seed)
        order = rng.permutation(n)
        self.nxt = np.empty(n, np.int64)
        self.nxt[order] = np.roll(order, -1)                      # row order[k] -> order[k + 1]
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        self.start_rows = order[(np.arange(n_walks) * n) // n_walks]
        self.end_rows = order[(rank[self.start_rows] + STEPS) % n]
        # room for n rows homed in each partition (homes alternate about evenly)
        self.copies = torch.zeros(int(2.3 * n) * ROW_WORDS, dtype=torch.int64, device=dev)
        pmap = partition_map(self.copies, topology=topo)
        self.undecided = pmap.undecided_fraction
        self.where = np.stack([pmap.blocks(p)[:n] for p in (0, 1)])  # where[p, r]: block of row r in copy p
        if self.where.shape[1] != n:
            raise RuntimeError("the buffer holds too few blocks of one partition")
        self.single = torch.zeros(n * ROW_WORDS, dtype=torch.int64, device=dev)
        self.where_dev = torch.from_numpy(self.where.astype(np.int32)).to(dev)
        # the copy each SM walks: its partition (an undecided SM takes copy 0)
        self.sm_part = torch.from_numpy(np.maximum(sm_labels(topo).partition, 0).astype(np.int64)).to(dev)

    def _put(self, single_values, copy_values) -> None:
        import torch

        self.single.view(self.n_rows, ROW_WORDS)[:, 0] = torch.from_numpy(single_values).to(self.dev)
        rows = self.copies.view(-1, ROW_WORDS)
        for p in (0, 1):
            rows[torch.from_numpy(self.where[p]).to(self.dev), 0] = torch.from_numpy(copy_values[p]).to(self.dev)

    def _address(self, buf, blocks):
        return buf.data_ptr() + np.asarray(blocks, np.int64) * ROW_BYTES

    def pointer_layout(self):
        """Write row addresses; return (starts single, starts replicated, expected single, expected per copy)."""
        import torch

        self._put(self._address(self.single, self.nxt),
                  [self._address(self.copies, self.where[p][self.nxt]) for p in (0, 1)])
        s = self._address(self.single, self.start_rows)
        starts_single = torch.from_numpy(np.stack([s, s], 1)).to(self.dev)
        starts_rep = torch.from_numpy(np.stack([self._address(self.copies, self.where[p][self.start_rows])
                                                for p in (0, 1)], 1)).to(self.dev)
        return (starts_single, starts_rep, self._address(self.single, self.end_rows),
                [self._address(self.copies, self.where[p][self.end_rows]) for p in (0, 1)])

    def index_layout(self):
        """Write next-row indices; return (starts, expected end rows)."""
        import torch

        self._put(self.nxt, [self.nxt, self.nxt])
        return torch.from_numpy(self.start_rows.astype(np.int64)).to(self.dev), self.end_rows


def run(dev, topo, reps: int) -> dict:
    import torch

    figures = {}
    for mb in TABLE_MB:
        for ctas in CTAS_PER_SM:
            grid = ctas * topo.n_sm
            n_walks = WALKS_PER_PROGRAM * grid
            t = Tables(dev, topo, mb << 20, n_walks)
            ends = torch.zeros(n_walks, dtype=torch.int64, device=dev)
            row = {}

            def measure(name, launch, ok):
                ends.zero_()
                launch()
                torch.cuda.synchronize()
                if not ok(ends.cpu().numpy()):
                    raise AssertionError(f"{mb} MB, {ctas} CTAs/SM, {name}: walks ended at the wrong rows")
                row[name] = timed(launch, reps)
                row[name]["ns_per_step"] = row[name]["p50"] * 1e6 / (WALKS_PER_PROGRAM * STEPS)

            s_single, s_rep, e_single, e_rep = t.pointer_layout()
            measure("single_pointer", lambda: walk_pointer_kernel[(grid,)](
                s_single, t.sm_part, ends, n_walks, STEPS, REPLICATED=False, num_warps=1),
                lambda got: np.array_equal(got, e_single))
            # a walk ends in the copy of the SM that ran it: either copy's end row is right
            measure("replicated_pointer", lambda: walk_pointer_kernel[(grid,)](
                s_rep, t.sm_part, ends, n_walks, STEPS, REPLICATED=True, num_warps=1),
                lambda got: bool(np.all((got == e_rep[0]) | (got == e_rep[1]))))
            starts, expected = t.index_layout()
            for name, buf, rep in (("single_index", t.single, False), ("replicated_index", t.copies, True)):
                measure(name, lambda buf=buf, rep=rep: walk_index_kernel[(grid,)](
                    buf, t.where_dev, starts, t.sm_part, ends, t.n_rows, n_walks, STEPS, REPLICATED=rep,
                    num_warps=1), lambda got: np.array_equal(got, expected))
            for name in row:
                row[name]["vs_single"] = row[name]["p50"] / row[f"single_{name.split('_')[1]}"]["p50"]
            key = f"{mb}MB_{ctas}cta_per_sm"
            figures[key] = dict(row, rows=t.n_rows, walks=n_walks, steps=STEPS, undecided_blocks=t.undecided)
            print(key, {k: (round(v["p50"], 3), round(v["vs_single"], 3)) for k, v in row.items()}, flush=True)
    return figures


TABLE = "replication"


def table_rows(figures: dict) -> list:
    """Per table size and CTAs per SM: each walk's ms (single buffer, replicated per partition)."""
    return [r for case, walks in figures["walks"].items() for r in quantile_rows(walks, case, "ms")]


def main(argv=None) -> dict:
    args = gpu_parser(__doc__, reps=15).parse_args(argv)
    dev, topo, calibration = calibrated_device(args.device, "replication")
    figures = {"calibration": calibration, "walks": run(dev, topo, args.reps)}
    write_result(args.out, figures, args.device, TABLE, table_rows(figures))
    return figures


if __name__ == "__main__":
    main()
