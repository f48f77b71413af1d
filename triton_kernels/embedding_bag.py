"""The embedding-bag forward kernel: one bag per item, rows gathered ROWS at a time as one [ROWS, BLOCK_D] tile.

Bandwidth is the whole game (65,536 bags x 32 rows x 256 B read 512 MB for 16 MB written): every row of a
ROWS-row chunk is loaded by one tile load, so ROWS independent row loads are in flight per program, each
a run of 16-byte vector loads (the row stride is specialised as a multiple of 16 elements when it is, and
then Triton proves the alignment). Sums and means accumulate in fp32 whatever the row dtype; max needs no
wider type. Bag b spans input[offsets[b] : offsets[b + 1]] (the last bag without a following offset ends
at n_indices); entries equal to padding_idx, and out-of-range entries (reached only when the host's check
is off: inside CUDA graphs and compiled regions), contribute nothing and do not count towards a mean, so
the kernel never reads outside the table.

Item loop: the kernel is a plain launch (program p takes bag p). Placement contract v2 replaces the one
line marked ITEM LOOP with plan_start / plan_next / plan_finish around `_bag` (see torch_l2topo/ops/
embedding_bag.py's docstring); `_bag` is the whole per-item body and needs no change.
"""
import triton
import triton.language as tl

# mode codes of torch.embedding_bag (and of the op's schema)
MODE_SUM = tl.constexpr(0)
MODE_MEAN = tl.constexpr(1)
MODE_MAX = tl.constexpr(2)


@triton.jit
def _bag(bag, input_ptr, offsets_ptr, weight_ptr, psw_ptr, out_ptr, n_indices, n_offsets, n_rows, dim, stride_w,
         padding_idx, MODE: tl.constexpr, HAS_PSW: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[bag, :dim] = the bag's sum / mean / max of weight rows (fp32 accumulation), 0 for an empty bag."""
    start = tl.load(offsets_ptr + bag).to(tl.int64)
    end = tl.load(offsets_ptr + bag + 1, mask=bag + 1 < n_offsets, other=n_indices).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < dim
    if MODE == MODE_MAX:
        acc = tl.full([BLOCK_D], float("-inf"), tl.float32)
    else:
        acc = tl.zeros([BLOCK_D], tl.float32)
    count = tl.zeros([ROWS], tl.int32)
    for first in range(start, end, ROWS):
        pos = first + tl.arange(0, ROWS)
        in_bag = pos < end
        idx = tl.load(input_ptr + pos, mask=in_bag, other=0).to(tl.int64)
        take = in_bag & (idx >= 0) & (idx < n_rows) & (idx != padding_idx)
        mask = take[:, None] & col_ok[None, :]
        if MODE == MODE_MAX:
            rows = tl.load(weight_ptr + idx[:, None] * stride_w + cols[None, :], mask=mask, other=float("-inf"))
            acc = tl.maximum(acc, tl.max(rows.to(tl.float32), axis=0))
        else:
            rows = tl.load(weight_ptr + idx[:, None] * stride_w + cols[None, :], mask=mask, other=0.0)
            rows = rows.to(tl.float32)
            if HAS_PSW:
                rows = rows * tl.load(psw_ptr + pos, mask=take, other=0.0).to(tl.float32)[:, None]
            acc += tl.sum(rows, axis=0)
        count += take.to(tl.int32)
    n_taken = tl.sum(count, axis=0)
    if MODE == MODE_MEAN:
        acc = acc / tl.maximum(n_taken, 1).to(tl.float32)
    if MODE == MODE_MAX:
        acc = tl.where(n_taken > 0, acc, 0.0)
    tl.store(out_ptr + bag.to(tl.int64) * dim + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def embedding_bag_kernel(input_ptr, offsets_ptr, weight_ptr, psw_ptr, out_ptr, n_indices, n_offsets, n_rows, dim,
                         stride_w, padding_idx, MODE: tl.constexpr, HAS_PSW: tl.constexpr, ROWS: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    # ITEM LOOP: one program per bag (a plain launch); placement contract v2 loops plan_next here instead.
    _bag(tl.program_id(0), input_ptr, offsets_ptr, weight_ptr, psw_ptr, out_ptr, n_indices, n_offsets, n_rows, dim,
         stride_w, padding_idx, MODE, HAS_PSW, ROWS, BLOCK_D)
