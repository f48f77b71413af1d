"""The tree-ensemble kernel: every (sample, tree) pair of a tile walks its tree for DEPTH dependent steps.

Nodes are 16-byte records [feature | default_left << 31, threshold bits or leaf row, left, right]
(torch_l2topo/ops/forest.py builds them); a sample goes left when x[feature] <= threshold, or when it is NaN and
default_left is set. Leaves point to themselves, so every walk takes exactly DEPTH steps without divergence; a
step is one vector record load and one load of x, both dependent on the last (a latency-bound chain). Items are
(sample block, tree chunk) pairs from the placement helpers (PLACE; PLACE_DIRECT compiles them away). Chunk 0
starts from base, so sums follow tree order as the libraries add them; in a chunked launch the last chunk of a
block to arrive (a barrier, then one acq_rel count on the block's counter, zeroed again) adds the partial sums in
chunk order (deterministic: no float atomics) and stores the prediction, times `scale` and through LINK, so the
host adds no pass. x loads are masked by n_features (a second line behind the load-time checks). REPLICAS 2:
each program walks the copy homed in its SM's L2 partition (sm_part[%smid]).
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start
from torch_l2topo.triton_kernels.protocol import sm_id

DEFAULT_LEFT_BIT = tl.constexpr(31)
# the links, as torch_l2topo.ops.forest_predict.LINKS numbers them
LINK_IDENTITY = tl.constexpr(0)
LINK_SIGMOID = tl.constexpr(1)
LINK_SIGMOID_PAIR = tl.constexpr(2)
LINK_SOFTMAX = tl.constexpr(3)
LINK_EXP = tl.constexpr(4)


@triton.jit
def _walk(nodes_ptr, x_ptr, node, samples, sample_ok, n_features, depth, BLOCK_S: tl.constexpr,
          BLOCK_T: tl.constexpr):
    """The leaf-value row each lane's walk ends at ([BLOCK_S, BLOCK_T] int64), after `depth` steps."""
    words = tl.arange(0, 4)
    x_row = x_ptr + samples.to(tl.int64)[:, None] * n_features
    for _ in range(depth):
        record = tl.load(nodes_ptr + node[:, :, None] * 4 + words[None, None, :])
        even, odd = tl.split(tl.reshape(record, [BLOCK_S, BLOCK_T, 2, 2]))  # words 0, 2 and words 1, 3
        packed, left = tl.split(even)
        threshold_bits, right = tl.split(odd)
        feature = packed & 0x7FFFFFFF
        # the loaders checked every feature (ops/forest.py); the mask keeps a hand-built forest inside x too
        value = tl.load(x_row + feature, mask=sample_ok[:, None] & (feature < n_features), other=0.0)
        go_left = (value <= threshold_bits.to(tl.float32, bitcast=True)) | ((value != value) & (packed < 0))
        node = tl.where(go_left, left, right).to(tl.int64)
    return tl.load(nodes_ptr + node * 4 + 1).to(tl.int64)


@triton.jit
def _sample_block(item, nodes_ptr, values_ptr, roots_ptr, groups_ptr, base_ptr, x_ptr, out_ptr, partial_ptr,
                  counts_ptr, n_samples, n_features, n_trees, trees_per_chunk, n_chunks, depth, n_outputs,
                  leaf_width, scale, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, OUT_PAD: tl.constexpr,
                  VECTOR_LEAVES: tl.constexpr, SUM_CHUNKS: tl.constexpr, LINK: tl.constexpr):
    chunk = item % n_chunks
    samples = (item // n_chunks) * BLOCK_S + tl.arange(0, BLOCK_S)
    sample_ok = samples < n_samples
    outputs = tl.arange(0, OUT_PAD)
    output_ok = outputs < n_outputs
    base = tl.load(base_ptr + outputs, mask=output_ok, other=0.0)
    acc = tl.zeros([BLOCK_S, OUT_PAD], tl.float32) + tl.where(chunk == 0, base, 0.0)[None, :]
    first = chunk * trees_per_chunk
    last = tl.minimum(first + trees_per_chunk, n_trees)
    for tree0 in range(first, last, BLOCK_T):
        trees = tree0 + tl.arange(0, BLOCK_T)
        tree_ok = trees < last
        roots = tl.load(roots_ptr + trees, mask=tree_ok, other=0).to(tl.int64)
        node = tl.zeros([BLOCK_S, BLOCK_T], tl.int64) + roots[None, :]
        rows = _walk(nodes_ptr, x_ptr, node, samples, sample_ok, n_features, depth, BLOCK_S, BLOCK_T)
        if VECTOR_LEAVES:
            values = tl.load(values_ptr + rows[:, :, None] * leaf_width + outputs[None, None, :],
                             mask=tree_ok[None, :, None] & output_ok[None, None, :], other=0.0)
            acc += tl.sum(values, axis=1)
        else:
            values = tl.load(values_ptr + rows, mask=tree_ok[None, :], other=0.0)
            groups = tl.load(groups_ptr + trees, mask=tree_ok, other=0)
            hit = groups[None, :, None] == outputs[None, None, :]
            acc += tl.sum(tl.where(hit, values[:, :, None], 0.0), axis=1)
    sums = acc * scale
    if n_chunks == 1:
        _store(out_ptr, sums, samples, sample_ok, outputs, output_ok, n_outputs, LINK)
    else:
        _add_chunk(out_ptr, partial_ptr, counts_ptr, sums, item // n_chunks, chunk, samples, sample_ok, outputs,
                   output_ok, n_samples, n_chunks, n_outputs, SUM_CHUNKS, LINK)


@triton.jit
def _add_chunk(out_ptr, partial_ptr, counts_ptr, sums, block, chunk, samples, sample_ok, outputs, output_ok,
               n_samples, n_chunks, n_outputs, SUM_CHUNKS: tl.constexpr, LINK: tl.constexpr):
    """A chunked launch: this chunk's sums into partial[chunk]; the block's last chunk to arrive adds them all and
    stores the prediction (module doc)."""
    mask = sample_ok[:, None] & output_ok[None, :]
    chunk_size = (tl.zeros((), tl.int64) + n_samples) * n_outputs  # int64: chunks x samples x outputs may pass 2**31
    tile = partial_ptr + samples.to(tl.int64)[:, None] * n_outputs + outputs[None, :]
    tl.store(tile + chunk * chunk_size, sums, mask=mask)
    tl.debug_barrier()  # every thread's stores before thread 0's count
    arrived = tl.atomic_add(counts_ptr + block, 1, sem="acq_rel")
    if arrived == n_chunks - 1:
        # SUM_CHUNKS chunks per load, so that their reads are in flight together (one chunk at a time was a chain
        # of dependent L2 round trips at the end of the launch)
        lanes = tl.arange(0, SUM_CHUNKS)
        total = tl.zeros_like(sums)
        for first in range(0, n_chunks, SUM_CHUNKS):
            chunks = first + lanes
            total += tl.sum(tl.load(tile[None, :, :] + chunks.to(tl.int64)[:, None, None] * chunk_size,
                                    mask=(chunks < n_chunks)[:, None, None] & mask[None, :, :], other=0.0,
                                    cache_modifier=".cg"), axis=0)
        _store(out_ptr, total, samples, sample_ok, outputs, output_ok, n_outputs, LINK)
        tl.store(counts_ptr + block, 0)  # every chunk of the block has counted: the next launch starts from zero


@triton.jit
def _store(out_ptr, sums, samples, sample_ok, outputs, output_ok, n_outputs, LINK: tl.constexpr):
    """The block's sums [BLOCK_S, OUT_PAD] through the link, into out[sample, :] (LINK_SIGMOID_PAIR: one output
    in, the two columns [1 - p, p] out)."""
    rows = samples.to(tl.int64)
    if LINK == LINK_SIGMOID_PAIR:
        p = tl.sum(tl.where(outputs[None, :] == 0, tl.sigmoid(sums), 0.0), axis=1)
        tl.store(out_ptr + rows * 2, 1.0 - p, mask=sample_ok)
        tl.store(out_ptr + rows * 2 + 1, p, mask=sample_ok)
    else:
        if LINK == LINK_SIGMOID:
            sums = tl.sigmoid(sums)
        elif LINK == LINK_EXP:
            sums = tl.exp(sums)
        elif LINK == LINK_SOFTMAX:
            shifted = sums - tl.max(tl.where(output_ok[None, :], sums, float("-inf")), axis=1)[:, None]
            e = tl.where(output_ok[None, :], tl.exp(shifted), 0.0)
            sums = e / tl.sum(e, axis=1)[:, None]
        tl.store(out_ptr + rows[:, None] * n_outputs + outputs[None, :], sums,
                 mask=sample_ok[:, None] & output_ok[None, :])


@triton.jit
def forest_kernel(nodes_ptr, values_ptr, roots_ptr, groups_ptr, base_ptr, x_ptr, out_ptr, partial_ptr, counts_ptr,
                  n_samples, n_features, n_trees, trees_per_chunk, n_chunks, depth, n_outputs, leaf_width, scale,
                  sm_part_ptr, n_sm, plan_ptr, state_ptr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr,
                  OUT_PAD: tl.constexpr, VECTOR_LEAVES: tl.constexpr, REPLICAS: tl.constexpr, PLACE: tl.constexpr,
                  SUM_CHUNKS: tl.constexpr, LINK: tl.constexpr):
    if REPLICAS > 1:  # this SM's copy: its roots are row `copy` of roots
        me = sm_id()
        copy = tl.load(sm_part_ptr + me, mask=me < n_sm, other=0)
        roots_ptr += copy * n_trees
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        _sample_block(item, nodes_ptr, values_ptr, roots_ptr, groups_ptr, base_ptr, x_ptr, out_ptr, partial_ptr,
                      counts_ptr, n_samples, n_features, n_trees, trees_per_chunk, n_chunks, depth, n_outputs,
                      leaf_width, scale, BLOCK_S, BLOCK_T, OUT_PAD, VECTOR_LEAVES, SUM_CHUNKS, LINK)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)
