"""Forest: a tree ensemble as flat tensors, in one of three node layouts, ready for forest_predict.

Internal nodes test `x[feature] <= threshold` (float32; the loaders in forest_sources.py convert each library's
test to exactly this) with a default direction for NaN; leaves hold a row of values. Prediction = (base + the
leaf rows of every tree, each added to its output group) / divisor, then a link (identity, sigmoid, softmax,
exp). Storage (triton_kernels/forest.py reads it): `nodes` (n_slots, 4) int32 records [feature | default_left
<< 31, threshold bits or the leaf's row, left, right], leaves pointing to themselves; `values`; `roots`,
`groups` per tree; `base` per output. Layouts: "bfs" (top levels share lines), "dfs" (a left child after its
parent), "blocks" (three levels per 128-byte block). TreeArrays is the layout-free form (`tree_arrays()`,
`relayout()`). Trees are checked once at load (indices and children in range, no cycles). Per-partition
copies (`per_partition()`, CUDA): one copy of the records per L2 partition, each only in 256-byte blocks its
partition homes, `roots` (2, n_trees) and `sm_partition` saying which copy each SM walks (docs/ops.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch

from ..errors import ForestFormatError, check_choice
from .forest_sources import DEFAULT_LEFT, MAX_FEATURES, TreeArrays, from_sklearn, from_xgboost_json

LAYOUTS = ("bfs", "dfs", "blocks")
TRANSFORMS = ("identity", "sigmoid", "sigmoid_pair", "softmax", "exp")
WORDS = 4             # int32 words per node record: 16 bytes, one vector load
BLOCK_LEVELS = 3      # levels per block of the "blocks" layout: 7 nodes ...
BLOCK_SLOTS = 8       # ... in 8 slots of 16 bytes: one 128-byte L2 line
HOME_BLOCK_BYTES = 256  # partition_map's block: 16 records, so a layout's 128-byte lines stay whole


@dataclass(frozen=True)
class Forest:
    nodes: torch.Tensor
    values: torch.Tensor
    roots: torch.Tensor
    groups: torch.Tensor
    base: torch.Tensor
    depth: int                 # steps of the longest walk (the deepest leaf's depth)
    n_features: int
    divisor: float = 1.0
    transform: str = "identity"
    squeeze: bool = False      # one output returned as (n,) rather than (n, 1)
    layout: str = "bfs"
    classes: Optional[tuple] = None  # class labels of a classifier, in output order
    sm_partition: Optional[torch.Tensor] = None  # per-partition copies: each SM's copy (module doc)

    @property
    def n_trees(self) -> int:
        return self.roots.shape[-1]

    @property
    def n_outputs(self) -> int:
        return self.base.numel()

    @property
    def leaf_width(self) -> int:
        return self.values.shape[1]

    @property
    def device(self) -> torch.device:
        return self.nodes.device

    @property
    def nbytes(self) -> int:
        """Bytes a walk may touch: node records and leaf values."""
        return self.nodes.numel() * 4 + self.values.numel() * self.values.element_size()

    @classmethod
    def from_trees(cls, trees: list, groups, base, n_features: int, *, layout: str = "bfs",
                   dtype: torch.dtype = torch.float64, **meta) -> Forest:
        """A forest of TreeArrays, laid out: leaves of one value add it to output groups[t] of their tree t;
        wider leaves are whole output rows (groups all 0)."""
        check_choice("layout", layout, LAYOUTS)
        if not trees:
            raise ValueError("a forest needs at least one tree")
        if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or \
                not 1 <= n_features <= MAX_FEATURES:
            raise ValueError(f"n_features must be an integer in [1, {MAX_FEATURES}]; got {n_features!r}")
        trees = [_checked(tree, int(n_features), t) for t, tree in enumerate(trees)]
        widths = sorted({t.value.shape[1] for t in trees})
        if len(widths) != 1:
            raise ValueError(f"every tree needs leaves of one width; got widths {widths}")
        base = np.atleast_1d(np.asarray(base, dtype=np.float64))
        groups = np.asarray(groups)
        if groups.shape != (len(trees),) or not _integers(groups) or groups.min() < 0 or groups.max() >= base.size:
            raise ValueError(f"groups must give each of the {len(trees)} trees an output in [0, {base.size})")
        if widths[0] > 1 and (widths[0] != base.size or groups.any()):
            raise ValueError(f"leaves of {widths[0]} values are whole output rows: they need {widths[0]} outputs "
                             f"(got {base.size}) and group 0 for every tree")
        records, values, roots, depth = [], [], [], 0
        n_slots = n_leaves = 0
        for tree in trees:
            tree_records, tree_values, tree_depth = _tree_records(tree, layout, n_slots, n_leaves)
            roots.append(n_slots)  # node 0 comes first in every layout
            records.append(tree_records)
            values.append(tree_values)
            n_slots += len(tree_records)
            n_leaves += len(tree_values)
            depth = max(depth, tree_depth)
        return cls(nodes=torch.from_numpy(np.concatenate(records)),
                   values=torch.from_numpy(np.concatenate(values)).to(dtype),
                   roots=torch.tensor(roots, dtype=torch.int32), groups=torch.from_numpy(groups.astype(np.int32)),
                   base=torch.from_numpy(base).to(dtype), depth=depth, n_features=int(n_features), layout=layout,
                   **meta)

    @classmethod
    def from_sklearn(cls, model, *, layout: str = "bfs") -> Forest:
        """A fitted scikit-learn tree, random forest, extra-trees or gradient-boosting model (see
        forest_sources.from_sklearn for what is supported)."""
        return cls.from_trees(**from_sklearn(model), layout=layout)

    @classmethod
    def from_xgboost_json(cls, path, *, layout: str = "bfs") -> Forest:
        """A gbtree model saved by xgboost (Booster.save_model("model.json")); xgboost itself is not needed.
        ForestFormatError naming the file for one that is not such a model, or whose trees a walk could not
        follow (checked here, once)."""
        check_choice("layout", layout, LAYOUTS)
        arguments = from_xgboost_json(path)
        try:
            return cls.from_trees(**arguments, layout=layout)
        except ValueError as exc:  # the trees' own checks
            raise ForestFormatError(f"{path}: {exc}") from None

    def to(self, device) -> Forest:
        """This forest on `device`; on a GPU leaf values and base are float32 (what the kernel adds)."""
        device = torch.device(device)
        if self.sm_partition is not None and device != self.device:
            raise ValueError("a forest with per-partition copies is homed on its GPU: move the forest first, then "
                             "call per_partition() there")
        dtype = torch.float32 if device.type == "cuda" else self.values.dtype
        return replace(self, nodes=self.nodes.to(device), values=self.values.to(device, dtype),
                       roots=self.roots.to(device), groups=self.groups.to(device),
                       base=self.base.to(device, dtype))

    def tree_arrays(self) -> list:
        """The trees as TreeArrays numbered breadth first, read back from this layout (copy 0 of per-partition
        copies)."""
        nodes = self.nodes.cpu().numpy()
        values = self.values.cpu().numpy()
        return [_read_tree(nodes, values, int(root)) for root in self.roots.reshape(-1, self.n_trees)[0].tolist()]

    def per_partition(self, topology=None) -> Forest:
        """This CUDA forest with one copy of its nodes homed in each L2 partition (module doc): the buffer's
        partition map is measured (partition_map), the SMs' partitions come from `topology` (default: calibrate()
        of the forest's GPU, cached). A second call returns the forest as it is."""
        if self.sm_partition is not None:
            return self
        if self.device.type != "cuda":
            raise ValueError(f"per-partition copies are homed in a GPU's L2: move the forest to a GPU first (it is "
                             f"on {self.device})")
        from ..analysis.labels import sm_labels
        from ..measure.calibration import calibration_for
        from ..placement.partition.maps import partition_map

        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        labels = sm_labels(calibration_for(index, topology))
        if not labels.partitions.found:
            raise ValueError(f"the calibration of cuda:{index} shows no two L2 partitions: nothing to copy per "
                             "partition")
        per_block = HOME_BLOCK_BYTES // (WORDS * 4)
        n_slots = self.nodes.shape[0]
        blocks = -(-n_slots // per_block)
        nodes, roots = self.nodes.cpu().numpy(), self.roots.cpu().numpy()
        for growth in (2.5, 4, 8):  # the homes split about 50/50: room for two copies, then more if one side is short
            buffer = torch.zeros((int(growth * blocks + 64) * per_block, WORDS), dtype=torch.int32,
                                 device=self.device)
            homes = partition_map(buffer, topology=topology, block_bytes=HOME_BLOCK_BYTES).homes
            try:
                records, copy_roots = replicated_records(nodes, roots, homes, buffer.shape[0])
                break
            except ValueError:
                continue
        else:
            raise ValueError(f"could not find {blocks} blocks homed in each partition of a buffer 8x the forest")
        buffer.copy_(torch.from_numpy(records))  # in place: the same allocation, so the homes still hold
        part = torch.from_numpy(np.maximum(np.asarray(labels.partition), 0).astype(np.int32))
        return replace(self, nodes=buffer, roots=torch.from_numpy(copy_roots).to(self.device),
                       sm_partition=part.to(self.device))

    def relayout(self, layout: str) -> Forest:
        """The same trees in another layout."""
        meta = dict(divisor=self.divisor, transform=self.transform, squeeze=self.squeeze, classes=self.classes)
        return Forest.from_trees(self.tree_arrays(), self.groups.cpu().numpy(), self.base.cpu().numpy(),
                                 self.n_features, layout=layout, dtype=self.values.dtype, **meta).to(self.device)


def homed_slots(n_slots: int, homes: np.ndarray, per_block: int) -> np.ndarray:
    """(2, n_slots) int64: where slot i of a layout goes in the copy homed in partition p: slots in order,
    per_block at a time, into the blocks that `homes` (partition of each block; -1 undecided) gives p, in
    order. ValueError when a partition has too few blocks."""
    homes = np.asarray(homes)
    need = -(-n_slots // per_block)
    out = np.empty((2, n_slots), dtype=np.int64)
    slot = np.arange(n_slots)
    for p in (0, 1):
        mine = np.flatnonzero(homes == p)
        if mine.size < need:
            raise ValueError(f"{mine.size} blocks homed in partition {p}; {need} needed")
        out[p] = mine[slot // per_block] * per_block + slot % per_block
    return out


def replicated_records(nodes: np.ndarray, roots: np.ndarray, homes: np.ndarray, capacity: int) -> tuple:
    """(records (capacity, 4) int32, roots (2, n_trees) int32): the node records of a layout written twice into
    a buffer of `capacity` records whose HOME_BLOCK_BYTES blocks are homed as `homes` says, copy p in blocks of
    partition p (homed_slots), each copy's child pointers rewritten into that copy; other records zero."""
    nodes = np.asarray(nodes, dtype=np.int32)
    per_block = HOME_BLOCK_BYTES // (WORDS * 4)
    where = homed_slots(nodes.shape[0], homes, per_block)
    if where.max(initial=-1) >= capacity:
        raise ValueError(f"the homed blocks run past the buffer's {capacity} records")
    out = np.zeros((capacity, WORDS), dtype=np.int32)
    for p in (0, 1):
        copy = nodes.copy()
        copy[:, 2] = where[p][nodes[:, 2]]
        copy[:, 3] = where[p][nodes[:, 3]]
        out[where[p]] = copy
    # contiguous: the kernel reads row p of the roots at p * n_trees (fancy indexing gave a column-major array)
    return out, np.ascontiguousarray(where[:, np.asarray(roots, dtype=np.int64)], dtype=np.int32)


def _integers(a: np.ndarray) -> bool:
    return a.dtype.kind in "iu"


def _checked(tree: TreeArrays, n_features: int, t: int) -> TreeArrays:
    """`tree` as a tree the kernels can walk without reading outside their arrays, or ValueError naming tree `t`
    and what is wrong: per-node arrays of unequal lengths or of the wrong kind, a child out of range or alone, a
    feature outside [0, n_features) at a node the walks reach; _levels finds a node reached twice (a cycle)."""
    arrays = {name: np.asarray(getattr(tree, name)) for name in TreeArrays._fields}
    n = arrays["left"].shape[0] if arrays["left"].ndim == 1 else -1
    for name, a in arrays.items():
        if a.shape[:1] != (n,) or a.ndim != (2 if name == "value" else 1) or n < 1:
            raise ValueError(f"tree {t}: {name} has shape {a.shape}; every per-node array needs one entry per node "
                             f"(left has shape {arrays['left'].shape})")
    for name in ("feature", "left", "right"):
        if not _integers(arrays[name]):
            raise ValueError(f"tree {t}: {name} must hold integers, not {arrays[name].dtype}")
    if arrays["threshold"].dtype.kind not in "fiu" or arrays["value"].dtype.kind not in "fiu":
        raise ValueError(f"tree {t}: thresholds and values must be real numbers, not {arrays['threshold'].dtype} "
                         f"and {arrays['value'].dtype}")
    if arrays["default_left"].dtype.kind not in "biu" or not np.isin(arrays["default_left"], (0, 1)).all():
        raise ValueError(f"tree {t}: default_left must be true/false (or 0/1)")
    left, right = arrays["left"].astype(np.int64), arrays["right"].astype(np.int64)
    for name, child in (("left", left), ("right", right)):
        bad = np.flatnonzero((child < -1) | (child >= n))
        if bad.size:
            raise ValueError(f"tree {t}: node {bad[0]}'s {name} child {child[bad[0]]} is outside [0, {n}) (-1: a leaf)")
    alone = np.flatnonzero((left < 0) != (right < 0))
    if alone.size:
        raise ValueError(f"tree {t}: node {alone[0]} has one child; every node needs two children or none")
    try:
        reached = np.concatenate(_levels(left, right))
    except ValueError as exc:
        raise ValueError(f"tree {t}: {exc}") from None
    inner = reached[left[reached] >= 0]
    feature = arrays["feature"][inner].astype(np.int64)
    bad = np.flatnonzero((feature < 0) | (feature >= n_features))
    if bad.size:
        raise ValueError(f"tree {t}: node {inner[bad[0]]} tests feature {feature[bad[0]]}, outside [0, {n_features})")
    checked = np.zeros(n, dtype=np.int32)  # nodes no walk reaches (pruned ones files keep) test feature 0
    checked[inner] = feature
    return TreeArrays(checked, arrays["threshold"], arrays["default_left"].astype(bool), left, right, arrays["value"])


def _levels(left: np.ndarray, right: np.ndarray) -> list:
    """Node ids level by level from the root 0; within a level, children in their parents' order, left first.
    ValueError for a node reached twice (a cycle, or two parents of one node)."""
    levels = [np.zeros(1, dtype=np.int64)]
    seen = np.zeros(left.size, dtype=bool)
    seen[0] = True
    while True:
        parents = levels[-1][left[levels[-1]] >= 0]
        if parents.size == 0:
            return levels
        children = np.stack([left[parents], right[parents]], axis=1).ravel().astype(np.int64)
        if seen[children].any() or np.unique(children).size != children.size:
            raise ValueError("not a tree: a node is reached twice from the root")
        seen[children] = True
        levels.append(children)


def _reachable(tree: TreeArrays) -> TreeArrays:
    """The nodes reachable from the root, numbered breadth first (files may keep pruned nodes)."""
    left = np.asarray(tree.left, dtype=np.int64)
    right = np.asarray(tree.right, dtype=np.int64)
    if left.shape != right.shape or ((left < 0) != (right < 0)).any():
        raise ValueError("every node needs two children or none")
    order = np.concatenate(_levels(left, right))
    if order.size == left.size and (order == np.arange(left.size)).all():
        return tree
    new = np.full(left.size, -1, dtype=np.int64)
    new[order] = np.arange(order.size)

    def renumbered(child):
        child = child[order]
        return np.where(child >= 0, new[np.maximum(child, 0)], -1).astype(np.int32)

    return TreeArrays(np.asarray(tree.feature)[order], np.asarray(tree.threshold)[order],
                      np.asarray(tree.default_left)[order], renumbered(left), renumbered(right),
                      np.asarray(tree.value)[order])


def _positions(left: np.ndarray, right: np.ndarray, levels: list, layout: str) -> tuple:
    """(slot of every node in the layout, slots used)."""
    n = left.size
    position = np.full(n, -1, dtype=np.int64)
    if layout == "bfs":
        position[np.concatenate(levels)] = np.arange(n)
        return position, n
    if layout == "dfs":
        size = np.ones(n, dtype=np.int64)
        for level in reversed(levels):
            inner = level[left[level] >= 0]
            size[inner] += size[left[inner]] + size[right[inner]]
        position[0] = 0
        for level in levels:
            inner = level[left[level] >= 0]
            position[left[inner]] = position[inner] + 1
            position[right[inner]] = position[inner] + 1 + size[left[inner]]
        return position, n
    block_root = np.zeros(n, dtype=np.int64)
    local = np.zeros(n, dtype=np.int64)
    for depth, level in enumerate(levels[:-1]):
        inner = level[left[level] >= 0]
        for child, side in ((left[inner], 0), (right[inner], 1)):
            if (depth + 1) % BLOCK_LEVELS == 0:
                block_root[child], local[child] = child, 0
            else:
                block_root[child], local[child] = block_root[inner], 2 * local[inner] + 1 + side
    bfs_rank = np.empty(n, dtype=np.int64)
    bfs_rank[np.concatenate(levels)] = np.arange(n)
    roots = np.unique(block_root)
    block_rank = np.empty(n, dtype=np.int64)
    block_rank[roots[np.argsort(bfs_rank[roots])]] = np.arange(roots.size)
    return BLOCK_SLOTS * block_rank[block_root] + local, BLOCK_SLOTS * roots.size


def _tree_records(tree: TreeArrays, layout: str, first_slot: int, first_leaf: int) -> tuple:
    """(node records (slots, 4) int32, leaf value rows in slot order, depth) of one tree placed at first_slot."""
    tree = _reachable(tree)
    left = np.asarray(tree.left, dtype=np.int64)
    right = np.asarray(tree.right, dtype=np.int64)
    levels = _levels(left, right)
    position, n_slots = _positions(left, right, levels, layout)
    slot = first_slot + position
    leaf = left < 0
    leaves = np.flatnonzero(leaf)[np.argsort(position[leaf])]
    leaf_row = np.empty(left.size, dtype=np.int64)
    leaf_row[leaves] = first_leaf + np.arange(leaves.size)
    inner = ~leaf
    records = np.zeros((n_slots, WORDS), dtype=np.int64)
    packed = np.asarray(tree.feature, dtype=np.int64) | (np.asarray(tree.default_left, dtype=bool) * DEFAULT_LEFT)
    threshold_bits = np.asarray(tree.threshold, dtype=np.float32).view(np.int32).astype(np.int64)
    records[position, 0] = np.where(inner, packed, 0)
    records[position, 1] = np.where(inner, threshold_bits, leaf_row)
    records[position, 2] = np.where(inner, slot[np.maximum(left, 0)], slot)
    records[position, 3] = np.where(inner, slot[np.maximum(right, 0)], slot)
    values = np.asarray(tree.value)[leaves]
    return records.astype(np.uint32).view(np.int32), values, len(levels) - 1


def _read_tree(nodes: np.ndarray, values: np.ndarray, root: int) -> TreeArrays:
    """One tree from flat records, numbered breadth first (the inverse of _tree_records)."""
    order = [np.array([root], dtype=np.int64)]
    while True:
        level = order[-1]
        inner = level[nodes[level, 2] != level]
        if inner.size == 0:
            break
        order.append(np.stack([nodes[inner, 2], nodes[inner, 3]], axis=1).ravel().astype(np.int64))
    slots = np.concatenate(order)
    local = {int(s): i for i, s in enumerate(slots)}
    rec = nodes[slots]
    leaf = rec[:, 2] == slots
    packed = rec[:, 0].view(np.uint32).astype(np.int64)
    child = np.vectorize(local.get, otypes=[np.int64])
    left = np.where(leaf, -1, child(np.where(leaf, slots, rec[:, 2])))
    right = np.where(leaf, -1, child(np.where(leaf, slots, rec[:, 3])))
    value = np.zeros((slots.size, values.shape[1]), dtype=values.dtype)
    value[leaf] = values[rec[leaf, 1]]
    return TreeArrays(feature=np.where(leaf, 0, packed & (DEFAULT_LEFT - 1)).astype(np.int32),
                      threshold=np.where(leaf, 0, rec[:, 1]).astype(np.int32).view(np.float32),
                      default_left=~leaf & (packed >= DEFAULT_LEFT), left=left.astype(np.int32),
                      right=right.astype(np.int32), value=value)
