"""The bad-input corpus (tests/data/bad/) and the sweep that feeds it to every command and loader.

    python tests/bad_inputs.py build    # rewrites tests/data/bad/ from the bundled and recorded data
    python tests/bad_inputs.py          # the sweep: every case's outcome, then the counts

A case is a command line (`python -m torch_l2topo ...`, run in this process) or a library call, on one input.
Its outcome is one of:
    correct         an odd but valid input, answered right (an oracle independent of the package says so)
    clear error     refused in one line naming the file or argument: the package's error for a file, ValueError
                    or TypeError for an argument; on the command line exit 2 and that one line on stderr
    raw exception   anything else that stops: a traceback, another exception, a message without the name
    silently wrong  a bad input answered as if it were good, or a valid one answered wrong (or refused)
tests/test_bad_inputs.py asserts "correct" or "clear error" for every case.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "bad"
CORRECT, CLEAR, RAW, WRONG = "correct", "clear error", "raw exception", "silently wrong"
OUTCOMES = (CORRECT, CLEAR, RAW, WRONG)
PER_SM = ("chain_cycles", "chain_ns", "chain_noise", "line_noise", "sm_clock_ghz")
BASE_LINES = 32   # lines kept of the bundled calibration: small files, still a whole calibration
BOMB_BYTES = 288 << 20  # a member that decompresses past topology.MAX_LOAD_BYTES (from a few hundred bytes)


# ---- building the corpus ------------------------------------------------------------------------------------
def _npz(arrays: dict, meta, compression=zipfile.ZIP_DEFLATED) -> bytes:
    """A calibration file as Topology.save writes one, from raw arrays and metadata (dict: the format version and
    checksum added; anything else written as it is)."""
    from torch_l2topo.topology import _checksum

    if isinstance(meta, dict):
        meta = dict(meta, format_version=meta.get("format_version", 1), checksum=_checksum(arrays))
    text = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return _zip({**arrays, "meta_json": np.frombuffer(text, np.uint8)}, compression)


def _zip(arrays: dict, compression=zipfile.ZIP_DEFLATED) -> bytes:
    """An .npz of these arrays as np.savez writes one, but the same bytes every time (fixed member dates)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, a in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(a), allow_pickle=a.dtype == object)
            z.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue(),
                       compress_type=compression)
    return buf.getvalue()


def _calibration() -> tuple:
    """(arrays, meta) of a small valid calibration: the bundled H200 example cut to its first BASE_LINES lines."""
    from torch_l2topo import load_example

    topo = load_example("h200")
    arrays = {name: getattr(topo, name) for name in PER_SM}
    arrays["line_cycles"] = topo.line_cycles[:, :BASE_LINES].copy()
    arrays["line_addresses"] = topo.line_addresses[:BASE_LINES].copy()
    return arrays, json.loads(json.dumps(topo.meta))


def _changed(arrays: dict, **changes) -> dict:
    return {**{k: np.array(v) for k, v in arrays.items()}, **changes}


def _set(a, index, value):
    a = np.array(a, dtype=np.float64)
    a[index] = value
    return a


def topology_files() -> dict:
    """{file name: bytes} of the calibration corpus."""
    arrays, meta = _calibration()
    good = _npz(arrays, meta)
    n = len(arrays["chain_cycles"])
    shrunk = {k: v[:0] for k, v in arrays.items() if k in PER_SM}
    device = dict(meta["device"])
    with np.load(io.BytesIO(good)) as z:  # the good file's metadata, checksum included, over altered arrays
        bad_checksum = _npz(_changed(arrays, chain_cycles=arrays["chain_cycles"] + 1), z["meta_json"].tobytes())
    files = {
        "empty.npz": b"",
        "text.npz": b"hello, this is not a calibration\n",
        "garbage.npz": np.random.default_rng(0).bytes(4096),
        "truncated.npz": good[:len(good) // 2],
        "pickled.npz": _zip({"chain_cycles": np.array([None], dtype=object)}),
        "no_meta.npz": _zip(arrays),
        "meta_not_utf8.npz": _npz(arrays, b"\xff\xfe{\"device\": 1}"),
        "meta_not_json.npz": _npz(arrays, b"{not json"),
        "meta_list.npz": _npz(arrays, [1, 2, 3]),
        "meta_string.npz": _npz(arrays, "a calibration"),
        "meta_device_list.npz": _npz(arrays, dict(meta, device=["NVIDIA H200", 132])),
        "meta_trust_string.npz": _npz(arrays, dict(meta, trust="yes")),
        "meta_config_list.npz": _npz(arrays, dict(meta, config=[2097152, 512])),
        "meta_cc_string.npz": _npz(arrays, dict(meta, device=dict(device, cc="9.0"))),
        "meta_sm_count_mismatch.npz": _npz(arrays, dict(meta, device=dict(device, sm_count=100))),
        "meta_name_number.npz": _npz(arrays, dict(meta, device=dict(device, name=200))),
        "version_2.npz": _npz(arrays, dict(meta, format_version=2)),
        "checksum_mismatch.npz": bad_checksum,
        "missing_chain_ns.npz": _npz({k: v for k, v in arrays.items() if k != "chain_ns"}, meta),
        "strings.npz": _npz(_changed(arrays, chain_cycles=arrays["chain_cycles"].astype("U12")), meta),
        "bool_clock.npz": _npz(_changed(arrays, sm_clock_ghz=np.ones(n, bool)), meta),
        "complex_lines.npz": _npz(_changed(arrays, line_cycles=arrays["line_cycles"].astype(np.complex64)), meta),
        "float_addresses.npz": _npz(_changed(arrays, line_addresses=arrays["line_addresses"] + 0.5), meta),
        "negative_latency.npz": _npz(_changed(arrays, chain_cycles=_set(arrays["chain_cycles"], 5, -280.0)), meta),
        "zero_latency_lines.npz": _npz(_changed(arrays, line_cycles=np.zeros_like(arrays["line_cycles"])), meta),
        "zero_clock.npz": _npz(_changed(arrays, sm_clock_ghz=_set(arrays["sm_clock_ghz"], 0, 0.0)), meta),
        "huge_clock.npz": _npz(_changed(arrays, sm_clock_ghz=np.full(n, 1e30)), meta),
        "nan_noise.npz": _npz(_changed(arrays, chain_noise=_set(arrays["chain_noise"], 3, np.nan)), meta),
        "negative_noise.npz": _npz(_changed(arrays, line_noise=_set(arrays["line_noise"], 2, -1.0)), meta),
        "inf_chain.npz": _npz(_changed(arrays, chain_cycles=_set(arrays["chain_cycles"], 1, np.inf)), meta),
        "zero_sms.npz": _npz(_changed(arrays, **shrunk, line_cycles=arrays["line_cycles"][:0]),
                             dict(meta, device=dict(device, sm_count=0))),
        "short_chain_ns.npz": _npz(_changed(arrays, chain_ns=arrays["chain_ns"][:-1]), meta),
        "line_cycles_1d.npz": _npz(_changed(arrays, line_cycles=arrays["line_cycles"][:, 0]), meta),
        "chain_0d.npz": _npz(_changed(arrays, chain_cycles=np.array(280.0)), meta),
        "chain_2d.npz": _npz(_changed(arrays, chain_cycles=arrays["chain_cycles"][:, None]), meta),
        "zero_lines.npz": _npz(_changed(arrays, line_cycles=arrays["line_cycles"][:, :0],
                                        line_addresses=arrays["line_addresses"][:0]), meta),
        "bomb.npz": _npz(_changed(arrays, extra_bomb=np.zeros(BOMB_BYTES, np.uint8)), meta, zipfile.ZIP_BZIP2),
        "ok_base.npz": good,
        "ok_float32.npz": _npz(_changed(arrays, **{k: arrays[k].astype(np.float32) for k in PER_SM}), meta),
        "ok_extra_array.npz": _npz(_changed(arrays, extra_note=np.arange(4)), meta),
        "ok_unicode_name.npz": _npz(arrays, dict(meta, device=dict(device, name="NVIDIA H200 \u00fcber-\u00e9tude"))),
        "ok_bare_meta.npz": _npz(arrays, {}),
    }
    return files


XGBOOST = ROOT / "tests" / "data" / "xgboost"
XGB_TREES = 3  # trees kept of each fixture


def _xgboost_doc(case: str) -> dict:
    """A recorded xgboost model cut to its first XGB_TREES trees (tree_info and the counts to match)."""
    doc = json.loads((XGBOOST / f"{case}.json").read_text())
    model = doc["learner"]["gradient_booster"]["model"]
    model["trees"] = model["trees"][:XGB_TREES]
    model["tree_info"] = model["tree_info"][:XGB_TREES]
    model["iteration_indptr"] = model["iteration_indptr"][:XGB_TREES + 1]
    model["gbtree_model_param"]["num_trees"] = str(XGB_TREES)
    return doc


def _xgb(case: str, change: Callable | None = None) -> bytes:
    doc = _xgboost_doc(case)
    if change is not None:
        change(doc)
    return json.dumps(doc).encode()


def _tree(doc, i=1) -> dict:
    return doc["learner"]["gradient_booster"]["model"]["trees"][i]


def _inner(doc, i=1) -> int:
    """An inner node of tree i (one with children)."""
    return next(k for k, c in enumerate(_tree(doc, i)["left_children"]) if c != -1 and k > 0)


def _put(key: str, value, node: Callable | int = 0, tree: int = 1) -> Callable:
    def change(doc):
        t = _tree(doc, tree)
        t[key][node(doc) if callable(node) else node] = value
    return change


def _params(**values) -> Callable:
    return lambda doc: doc["learner"]["learner_model_param"].update(values)


def _model(**values) -> Callable:
    return lambda doc: doc["learner"]["gradient_booster"]["model"].update(values)


def _cycle(doc):
    t = _tree(doc)
    t["left_children"][_inner(doc)] = 0  # an inner node's child is the root: a cycle


def _shared(doc):
    t = _tree(doc)
    t["right_children"][0] = t["left_children"][0]  # both children of the root are one node


def _one_child(doc):
    _tree(doc)["right_children"][_inner(doc)] = -1


def _short_conditions(doc):
    _tree(doc)["split_conditions"].pop()


XGB_REG, XGB_LOGISTIC, XGB_POISSON = "regression_d3", "binary_d6_nan", "poisson_d5"


def xgboost_files() -> dict:
    reg, logistic = XGB_REG, XGB_LOGISTIC
    good = _xgb(reg)
    return {
        "empty.json": b"",
        "not_json.json": b"{\"learner\": {model",
        "truncated.json": good[:len(good) // 2],
        "not_utf8.json": b"{\"learner\": \"\xff\xfe\"}",
        "top_level_array.json": b"[1, 2, 3]",
        "null.json": b"null",
        "no_learner.json": json.dumps({"version": [3, 2, 0]}).encode(),
        "trees_not_list.json": _xgb(reg, _model(trees={"0": 1})),
        "tree_not_object.json": _xgb(reg, lambda d: d["learner"]["gradient_booster"]["model"]["trees"].__setitem__(
            0, 5)),
        "tree_without_conditions.json": _xgb(reg, lambda d: _tree(d).pop("split_conditions")),
        "zero_trees.json": _xgb(reg, _model(trees=[], tree_info=[])),
        "tree_info_short.json": _xgb(reg, _model(tree_info=[0])),
        "tree_info_string.json": _xgb(reg, _model(tree_info=["zero", 0, 0])),
        "tree_info_out_of_range.json": _xgb(reg, _model(tree_info=[0, 3, 0])),
        "split_index_too_big.json": _xgb(reg, _put("split_indices", 6)),
        "split_index_negative.json": _xgb(reg, _put("split_indices", -1)),
        "split_index_2pow31.json": _xgb(reg, _put("split_indices", 2 ** 31)),
        "split_index_2pow32.json": _xgb(reg, _put("split_indices", 2 ** 32)),
        "split_index_huge.json": _xgb(reg, _put("split_indices", 2 ** 70)),
        "split_index_string.json": _xgb(reg, _put("split_indices", "3")),
        "split_index_float.json": _xgb(reg, _put("split_indices", 2.5)),
        "split_index_bool.json": _xgb(reg, _put("split_indices", True)),
        "child_out_of_range.json": _xgb(reg, _put("left_children", 999)),
        "child_2pow32.json": _xgb(reg, _put("left_children", 2 ** 32 + 1)),
        "child_negative.json": _xgb(reg, _put("left_children", -5)),
        "one_child.json": _xgb(reg, _one_child),
        "cycle.json": _xgb(reg, _cycle),
        "self_loop.json": _xgb(reg, _put("right_children", 0)),
        "shared_child.json": _xgb(reg, _shared),
        "unequal_lengths.json": _xgb(reg, _short_conditions),
        "default_left_two.json": _xgb(reg, _put("default_left", 2)),
        "condition_string.json": _xgb(reg, _put("split_conditions", "abc")),
        "num_feature_string.json": _xgb(reg, _params(num_feature="six")),
        "num_feature_zero.json": _xgb(reg, _params(num_feature="0")),
        "num_feature_huge.json": _xgb(reg, _params(num_feature=str(2 ** 40))),
        "num_class_string.json": _xgb(reg, _params(num_class="three")),
        "base_score_garbage.json": _xgb(reg, _params(base_score="abc")),
        "base_score_empty.json": _xgb(reg, _params(base_score="[]")),
        "base_score_nan_regression.json": _xgb(reg, _params(base_score="NaN")),
        "base_score_zero_logistic.json": _xgb(logistic, _params(base_score="[0E0]")),
        "base_score_one_logistic.json": _xgb(logistic, _params(base_score="[1E0]")),
        "base_score_nan_logistic.json": _xgb(logistic, _params(base_score="[NaN]")),
        "base_score_negative_poisson.json": _xgb(XGB_POISSON, _params(base_score="[-5E-1]")),
        "objective_unknown.json": _xgb(reg, lambda d: d["learner"]["objective"].update(name="reg:quantileerror")),
        "ok_condition_nan.json": _xgb(reg, _put("split_conditions", float("nan"))),
        "ok_condition_minus_inf.json": _xgb(reg, _put("split_conditions", float("-inf"))),
        "ok_condition_plus_inf.json": _xgb(reg, _put("split_conditions", float("inf"))),
        "ok_leaf_nan.json": _xgb(reg, _put("split_conditions", float("nan"), node=lambda d: _tree(d)[
            "left_children"].index(-1))),
        "ok_base_score_plain.json": _xgb(logistic, _params(base_score="0.25")),
        "ok_logistic.json": _xgb(logistic),
        "ok_regression.json": good,
    }


def _enriched_trace() -> dict:
    """The recorded H200 trace (tests/data/profiler) enriched, cut to what the readers use: Kineto's top-level keys,
    its kernel events, our launch slices, track names and the CTAs of the first launch."""
    from torch_l2topo.profiler.trace.offline import enrich_raw
    from torch_l2topo.profiler.trace.tracefile import is_ours

    trace = enrich_raw(ROOT / "tests" / "data" / "profiler")
    events = trace["traceEvents"]
    first = next(ev["args"]["launch"] for ev in events if ev.get("cat") == "l2topo.launch")
    keep = [ev for ev in events if ev.get("cat") in ("kernel", "l2topo.launch") or (is_ours(ev) and (
        ev.get("ph") == "M" or (ev.get("cat") == "l2topo.cta" and ev["args"]["launch"] == first)))]
    return {**trace, "traceEvents": keep}


def _launch(trace) -> dict:
    return next(ev for ev in trace["traceEvents"] if ev.get("cat") == "l2topo.launch")


def _device(trace) -> dict:
    return trace["l2topo"]["devices"]["0"]


def _gz(trace) -> bytes:
    return gzip.compress(json.dumps(trace).encode(), mtime=0)


def _unicode_kernel(trace) -> None:
    for ev in trace["traceEvents"]:
        if ev.get("cat") in ("l2topo.launch", "l2topo.cta"):
            ev["name"] = "\u044f\u0434\u0440\u043e_kernel"
            if "kernel" in ev["args"]:
                ev["args"]["kernel"] = ev["name"]


def trace_files() -> dict:
    base = _enriched_trace()

    def damaged(change):
        t = json.loads(json.dumps(base))
        change(t)
        return _gz(t)

    text = json.dumps(base).encode()
    return {
        "empty.json": b"",
        "not_json.json": b"{\"traceEvents\": [",
        "not_utf8.json": b"{\"traceEvents\": [], \"schemaVersion\": \"\xff\xfe\"}",
        "top_level_array.json": b"[]",
        "garbage.json.gz": b"\x1f\x8b" + np.random.default_rng(1).bytes(512),
        "truncated.json.gz": _gz(base)[:4000],
        "not_enriched.json.gz": damaged(lambda t: t.pop("l2topo")),
        "metadata_string.json.gz": damaged(lambda t: t.update(l2topo="enriched")),
        "devices_list.json.gz": damaged(lambda t: t["l2topo"].update(devices=[])),
        "device_entry_list.json.gz": damaged(lambda t: t["l2topo"]["devices"].update({"0": [1, 2]})),
        "device_key_word.json.gz": damaged(lambda t: t["l2topo"]["devices"].update(
            {"zero": t["l2topo"]["devices"].pop("0")})),
        "calibration_string.json.gz": damaged(lambda t: _device(t).update(calibration="h200")),
        "partition_string.json.gz": damaged(lambda t: _device(t)["calibration"].update(partition="abc")),
        "partition_number.json.gz": damaged(lambda t: _device(t)["calibration"].update(partition=7)),
        "partition_nested.json.gz": damaged(lambda t: _device(t)["calibration"].update(partition=[[0, 1], [1, 0]])),
        "partition_values.json.gz": damaged(lambda t: _device(t)["calibration"].update(partition=[5] * 132)),
        "partition_missing.json.gz": damaged(lambda t: _device(t)["calibration"].pop("partition")),
        "chain_short.json.gz": damaged(lambda t: _device(t)["calibration"].update(chain_cycles=[280.0] * 10)),
        "calibration_device_list.json.gz": damaged(lambda t: _device(t)["calibration"].update(device=["H200"])),
        "alignment_empty.json.gz": damaged(lambda t: _device(t)["alignment"].update(recorder={})),
        "alignment_list.json.gz": damaged(lambda t: _device(t).update(alignment=[1])),
        "dropped_string.json.gz": damaged(lambda t: _device(t).update(dropped="none")),
        "notes_string.json.gz": damaged(lambda t: t["l2topo"].update(notes="abc")),
        "coverage_string.json.gz": damaged(lambda t: _device(t).update(uncovered_kernels="all")),
        "coverage_ratio_word.json.gz": damaged(lambda t: _device(t).update(instrumented_gpu_time_ratio="most")),
        "launch_waves_string.json.gz": damaged(lambda t: _launch(t)["args"].update(waves="two")),
        "launch_without_ctas.json.gz": damaged(lambda t: _launch(t)["args"].pop("ctas")),
        "launch_args_list.json.gz": damaged(lambda t: _launch(t).update(args=[1, 2])),
        "launch_tail_string.json.gz": damaged(lambda t: _launch(t)["args"].update(tail_ns="long")),
        "launch_ctas_negative.json.gz": damaged(lambda t: _launch(t)["args"].update(ctas=-5)),
        "launch_pid_string.json.gz": damaged(lambda t: _launch(t).update(pid="gpu0")),
        "launch_name_number.json.gz": damaged(lambda t: [_launch(t).update(name=17), _launch(t)["args"].pop("kernel")]),
        "cta_without_sm.json.gz": damaged(lambda t: next(ev for ev in t["traceEvents"] if ev.get("cat") ==
                                                          "l2topo.cta")["args"].pop("sm")),
        "ok_no_launches.json.gz": damaged(lambda t: t.update(traceEvents=[
            ev for ev in t["traceEvents"] if ev.get("cat") not in ("l2topo.launch", "l2topo.cta")])),
        "ok_unicode_kernel.json.gz": damaged(_unicode_kernel),
        "ok_plain.json": text,
    }


CTA_DAMAGE = ("cta_without_sm.json.gz",)
RECORDED_GEOMETRY = ROOT / "tests" / "data" / "geometry" / "geometry_h200_a632ac7b8bef.json"


def _damaged(doc, change) -> bytes:
    """The JSON bytes of a deep copy of `doc` after `change` (a function that edits it in place)."""
    copy = json.loads(json.dumps(doc))
    change(copy)
    return json.dumps(copy).encode()


def geometry_files() -> dict:
    doc = json.loads(RECORDED_GEOMETRY.read_text())
    result = doc["figures"]
    result["experiments"] = {k: result["experiments"][k] for k in ("first_touch", "stride_sweep")}

    damaged = partial(_damaged, result)

    return {
        "empty.json": b"",
        "not_json.json": b"{\"quick\": tru",
        "not_utf8.json": b"{\"quick\": true, \"experiments\": {}, \"note\": \"\xff\xfe\"}",
        "top_level_array.json": b"[{\"experiments\": {}}]",
        "no_experiments.json": damaged(lambda r: r.pop("experiments")),
        "no_quick.json": damaged(lambda r: r.pop("quick")),
        "experiments_list.json": damaged(lambda r: r.update(experiments=[1, 2])),
        "experiment_string.json": damaged(lambda r: r["experiments"].update(stride_sweep="fast")),
        "experiment_missing_key.json": damaged(lambda r: r["experiments"]["first_touch"].pop("hit_cycles")),
        "n_sm_string.json": damaged(lambda r: r.update(n_sm="many")),
        "clock_null.json": damaged(lambda r: r.update(clock_ghz=None)),
        "ok_result.json": json.dumps(result).encode(),
        "ok_wrapped.json": json.dumps({"command": doc["command"], "env": doc["env"], "figures": result}).encode(),
    }


def registry_files() -> dict:
    """Registry entries (Registry.add's JSON), each fed to `identify` in a registry of its own."""
    import tempfile

    from torch_l2topo import Registry, load_example

    with tempfile.TemporaryDirectory() as tmp:
        entry = json.loads(Registry(tmp).add("ref", load_example("h200")).read_text())

    damaged = partial(_damaged, entry)

    return {
        "empty.json": b"",
        "not_json.json": b"{\"format\": ",
        "not_utf8.json": b"{\"format\": \"\xff\xfe\"}",
        "top_level_array.json": b"[]",
        "wrong_format.json": damaged(lambda d: d.update(format="something else")),
        "wrong_version.json": damaged(lambda d: d.update(version=99)),
        "no_device.json": damaged(lambda d: d.pop("device")),
        "sm_count_string.json": damaged(lambda d: d["device"].update(sm_count="132")),
        "name_number.json": damaged(lambda d: d["device"].update(name=200)),
        "vector_strings.json": damaged(lambda d: d.update(vector=["1.0"] * len(d["vector"]))),
        "vector_nan.json": damaged(lambda d: d["vector"].__setitem__(0, float("nan"))),
        "vector_short.json": damaged(lambda d: d.update(vector=d["vector"][:10])),
        "vector_empty.json": damaged(lambda d: d.update(vector=[])),
        "identity_bad_hash.json": damaged(lambda d: d["identity"].update(uuid_hash="not-a-hash")),
        "ok_entry.json": json.dumps(entry).encode(),
    }


GROUPS = {"topology": topology_files, "xgboost": xgboost_files, "trace": trace_files, "geometry": geometry_files,
          "registry": registry_files}


def build(out: Path = CORPUS) -> None:
    """Write every corpus file (the files are committed; this says how they were made)."""
    for group, make in GROUPS.items():
        folder = out / group
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, data in make().items():
            (folder / name).write_bytes(data)


# ---- oracles (independent of the package) ----------------------------------------------------------------------
def xgboost_reference(doc: dict, x: np.ndarray) -> np.ndarray:
    """What xgboost's predictor computes, node by node as its CPU predictor does: float32 sums from the base margin
    in tree order; at a node, a missing value takes the default side, else x < split_condition goes left."""
    learner = doc["learner"]
    params, objective = learner["learner_model_param"], learner["objective"]["name"]
    model = learner["gradient_booster"]["model"]
    n_out = max(int(params.get("num_class", "0")), 1)
    score = np.float32(float(str(params["base_score"]).strip("[]").split(",")[0]))
    logistic, exp = objective in ("binary:logistic", "reg:logistic"), objective in ("count:poisson", "reg:gamma",
                                                                                  "reg:tweedie")
    base = -np.log(np.float32(1) / score - np.float32(1)) if logistic else np.log(score) if exp else score
    margin = np.full((len(x), n_out), base, dtype=np.float32)
    for tree, group in zip(model["trees"], model["tree_info"]):
        for i, row in enumerate(x):
            node = 0
            while tree["left_children"][node] != -1:
                v = row[tree["split_indices"][node]]
                left = bool(tree["default_left"][node]) if np.isnan(v) else \
                    np.float32(v) < np.float32(tree["split_conditions"][node])
                node = tree["left_children"][node] if left else tree["right_children"][node]
            margin[i, group] += np.float32(tree["split_conditions"][node])
    if logistic:
        return 1 / (1 + np.exp(-margin[:, 0].astype(np.float64)))
    return np.exp(margin[:, 0].astype(np.float64)) if exp else margin[:, 0].astype(np.float64)


def _xgboost_inputs(case: str) -> np.ndarray:
    x = np.load(XGBOOST / f"{case}.npz")["x"][:64].copy()
    x[:4] = [[-np.inf] * 6, [np.inf] * 6, [-0.0] * 6, [np.nan, 1e38, -1e38, 0.0, np.inf, -np.inf]]  # extremes
    return x


def _predict_xgboost(path: Path) -> np.ndarray:
    import torch

    from torch_l2topo.ops import Forest, forest_predict

    forest = Forest.from_xgboost_json(path)
    case = XGB_LOGISTIC if json.loads(path.read_text())["learner"]["objective"]["name"] == "binary:logistic" \
        else XGB_REG
    return forest_predict(forest, torch.from_numpy(_xgboost_inputs(case))).double().numpy()


def _xgboost_oracle(path: Path) -> Callable:
    doc = json.loads(path.read_text())
    case = XGB_LOGISTIC if doc["learner"]["objective"]["name"] == "binary:logistic" else XGB_REG
    want = xgboost_reference(doc, _xgboost_inputs(case))
    return lambda got: np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True) and \
        np.array_equal(np.isnan(got), np.isnan(want))


def _topology_oracle(path: Path) -> Callable:
    """The summary a calibration's arrays call for: its SM count and chain minimum, read with numpy alone."""
    with np.load(path) as z:
        chain = z["chain_cycles"].astype(np.float64)
        meta = json.loads(z["meta_json"].tobytes())
    name = (meta.get("device") or {}).get("name", "?")
    return lambda text: f"{len(chain)} SMs" in text and f"min {chain.min():.2f}" in text and name in text


def _topology_summary(path: Path) -> str:
    from torch_l2topo import Topology

    return Topology.load(path).summary()


def _trace_oracle(path: Path) -> Callable:
    """Each launch slice's kernel, read with json alone, and the calibration's SM count."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        trace = json.load(f)
    kernels = {ev["name"] for ev in trace["traceEvents"] if ev.get("cat") == "l2topo.launch"}
    sms = len(trace["l2topo"]["devices"]["0"]["calibration"]["partition"])
    return lambda text: f"{sms} SMs" in text and all(k in text for k in kernels) and \
        (bool(kernels) or "no instrumented kernel launches" in text)


def _identify_oracle(path: Path) -> Callable:
    """The registry holds the bundled h200 example itself: identify must call it a match, by name."""
    return lambda text: text.splitlines()[-1].startswith(f"match: '{path.stem}'")


def _trace_json_oracle(path: Path) -> Callable:
    """The kernels of the --json summary: one row per (device, kernel) of the launch slices, read with json."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        trace = json.load(f)
    kernels = sorted({ev["name"] for ev in trace["traceEvents"] if ev.get("cat") == "l2topo.launch"})
    return lambda text: sorted(row["kernel"] for row in json.loads(text)["kernels"]) == kernels


def _trace_summary(path: Path) -> str:
    from torch_l2topo.profiler.trace.summary import format_summary, summarize
    from torch_l2topo.profiler.trace.tracefile import load_trace

    return format_summary(summarize(load_trace(path), str(path)))


def _geometry_oracle(path: Path) -> Callable:
    doc = json.loads(path.read_text())
    result = doc.get("figures", doc)
    return lambda text: f"L2 geometry ({'quick' if result['quick'] else 'full'}): {result['n_sm']} SMs" in text


def _geometry_summary(path: Path) -> str:
    from torch_l2topo.geometry.figures import load_geometry
    from torch_l2topo.geometry.summary import summary_lines

    return "\n".join(summary_lines(load_geometry(path)))


# ---- the cases ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """argv (a command line; "{file}", "{work}" and "{registry}" filled in) or call (a library call on the file);
    `name`: what a refusal must name (default: the file's name); `oracle(output) -> bool` for a valid input
    (None: the input must be refused); `errors`: the exception types a library refusal may raise."""
    id: str
    file: Optional[str] = None
    argv: Optional[tuple] = None
    call: Optional[Callable] = None
    name: Optional[str] = None
    oracle: Optional[Callable] = field(default=None, compare=False)  # made from the file (lazily)
    errors: tuple = ()

    @property
    def path(self) -> Optional[Path]:
        return CORPUS / self.file if self.file else None


def _cases() -> list:
    from torch_l2topo.errors import L2TopoError

    cases = []
    for name in topology_files_names():
        f = f"topology/{name}"
        ok = name.startswith("ok_")
        oracle = _topology_oracle if ok else None
        cases.append(Case(f"load:{name}", f, call=_topology_summary, oracle=oracle, errors=(L2TopoError,)))
        cases.append(Case(f"show:{name}", f, argv=("show", "{file}"), oracle=oracle))
        if ok:
            continue  # the verbs below read a calibration the same way; their own output is tested elsewhere
        cases += [Case(f"report:{name}", f, argv=("report", "{file}", "-o", "{work}/report")),
                  Case(f"report-compare:{name}", f, argv=("report", str(CORPUS / "topology" / "ok_base.npz"),
                                                            "--compare", "{file}", "-o", "{work}/report")),
                  Case(f"enroll:{name}", f, argv=("enroll", "x", "{file}", "--registry", "{work}/enrolled",
                                                  "--replace")),
                  Case(f"identify:{name}", f, argv=("identify", "{file}", "--registry", "{registry}")),
                  Case(f"fleet:{name}", f, argv=("fleet", "--file", "{file}"))]
    for name in xgboost_files_names():
        f = f"xgboost/{name}"
        cases.append(Case(f"xgboost:{name}", f, call=_predict_xgboost,
                          oracle=_xgboost_oracle if name.startswith("ok_") else None, errors=(L2TopoError,)))
    for name in trace_files_names():
        f = f"trace/{name}"
        ok = name.startswith("ok_")
        # a damaged CTA slice leaves the summary (of launch slices) right: only the timeline reads CTAs
        oracle = _trace_oracle if ok or name in CTA_DAMAGE else None
        cases += [Case(f"summarize:{name}", f, call=_trace_summary, oracle=oracle, errors=(L2TopoError,)),
                  Case(f"trace-summary:{name}", f, argv=("trace-summary", "{file}"), oracle=oracle),
                  Case(f"trace-summary-json:{name}", f, argv=("trace-summary", "{file}", "--json"),
                       oracle=_trace_json_oracle if oracle else None)]
        if not ok:
            cases.append(Case(f"trace-timeline:{name}", f, argv=("trace-summary", "{file}", "--timeline",
                                                                 "{work}/timeline.png")))
    for name in geometry_files_names():
        f = f"geometry/{name}"
        ok = name.startswith("ok_")
        oracle = _geometry_oracle if ok else None
        cases += [Case(f"load_geometry:{name}", f, call=_geometry_summary, oracle=oracle, errors=(L2TopoError,)),
                  Case(f"geometry-from:{name}", f, argv=("geometry", "--from", "{file}"), oracle=oracle)]
        if not ok:
            cases.append(Case(f"report-geometry:{name}", f, argv=("report", "--geometry", "{file}", "-o",
                                                                  "{work}/report")))
    for name in _names("registry"):
        cases.append(Case(f"identify-registry:{name}", f"registry/{name}", name=Path(name).stem,
                          argv=("identify", "h200", "--registry", "{entry_registry}"),
                          oracle=_identify_oracle if name.startswith("ok_") else None))
    good_trace = "trace/ok_plain.json"
    cases += [
        Case("fleet-file-unknown-field", argv=("fleet", "--file", "cal-{foo}.npz"), name="{foo}"),
        Case("fleet-file-open-brace", argv=("fleet", "--file", "cal-{rank.npz"), name="--file"),
        Case("fleet-file-index", argv=("fleet", "--file", "cal-{0}.npz"), name="{0}"),
        Case("fleet-timeout-negative", argv=("fleet", "--file", "h200", "--timeout", "-1"), name="--timeout"),
        Case("fleet-timeout-nan", argv=("fleet", "--file", "h200", "--timeout", "nan"), name="--timeout"),
        Case("fleet-timeout-zero", argv=("fleet", "--file", "h200", "--timeout", "0"), name="--timeout"),
        Case("show-directory", argv=("show", "{work}"), name="{work}"),
        Case("trace-summary-directory", argv=("trace-summary", "{work}"), name="{work}"),
        Case("geometry-from-directory", argv=("geometry", "--from", "{work}"), name="{work}"),
        Case("geometry-from-missing", argv=("geometry", "--from", "{work}/nope.json"), name="nope.json"),
        Case("trace-summary-missing", argv=("trace-summary", "{work}/nope.json"), name="nope.json"),
        Case("trace-timeline-unknown-kernel", good_trace, argv=("trace-summary", "{file}", "--timeline",
                                                                "{work}/t.png", "--kernel", "nope"), name="nope"),
        Case("identify-registry-is-a-file", "topology/text.npz", argv=("identify", "h200", "--registry", "{file}")),
        Case("show-unknown-example", argv=("show", "--example", "h300"), name="h300"),
    ]
    for label, make in SKLEARN_MODELS.items():
        cases.append(Case(f"from_sklearn:{label}", call=lambda _, make=make: _from_sklearn(make()),
                          name=label.split(":")[0], errors=(TypeError, ValueError)))
    return cases


def _names(group: str) -> list:
    folder = CORPUS / group
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def topology_files_names() -> list:
    return _names("topology")


def xgboost_files_names() -> list:
    return _names("xgboost")


def trace_files_names() -> list:
    return _names("trace")


def geometry_files_names() -> list:
    return _names("geometry")


def _sklearn_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4))
    return x, (x[:, 0] + x[:, 1] > 0).astype(int)


def _fitted(cls, **kw):
    def make():
        x, y = _sklearn_data()
        return cls(**kw).fit(x, y)
    return make


def _sklearn_models() -> dict:
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier, IsolationForest, RandomForestClassifier
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
    except ImportError:
        return {}
    return {"IsolationForest": _fitted(IsolationForest, n_estimators=3, random_state=0),
            "HistGradientBoostingClassifier": _fitted(HistGradientBoostingClassifier, max_iter=2),
            "RandomForestClassifier:unfitted": lambda: RandomForestClassifier(n_estimators=2),
            "LogisticRegression": _fitted(LogisticRegression),
            "Pipeline": lambda: make_pipeline(StandardScaler(), RandomForestClassifier(n_estimators=2)).fit(
                *_sklearn_data()),
            "str": lambda: "model.pkl"}


SKLEARN_MODELS = _sklearn_models()


def _from_sklearn(model):
    from torch_l2topo.ops import Forest

    return Forest.from_sklearn(model)


CASES = _cases()


# ---- running a case ---------------------------------------------------------------------------------------------
def prepare(work: Path) -> dict:
    """The places the command lines name: a work directory and a registry holding one GPU."""
    from torch_l2topo import Registry, load_example

    registry = work / "registry"
    Registry(registry).add("reference", load_example("h200"), replace=True)
    return {"work": str(work), "registry": str(registry)}


def _filled(case: Case, where: dict) -> tuple:
    values = dict(where, file=str(case.path) if case.path else "")
    if "{entry_registry}" in case.argv:  # a registry holding the case's entry alone, under its own name
        registry = Path(where["work"]) / "registries" / case.path.stem
        registry.mkdir(parents=True, exist_ok=True)
        (registry / case.path.name).write_bytes(case.path.read_bytes())
        values["entry_registry"] = str(registry)
    return tuple(a.replace("{file}", values["file"]).replace("{work}", values["work"]).replace(
        "{registry}", values["registry"]).replace("{entry_registry}", values.get("entry_registry", ""))
        for a in case.argv)


def _run_cli(argv) -> tuple:
    from torch_l2topo.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def run(case: Case, where: dict) -> tuple:
    """(outcome, detail) of one case."""
    name = case.name or (case.path.name if case.path else "")
    name = name.replace("{work}", where["work"])
    oracle = case.oracle(case.path) if case.oracle else None
    if case.argv is not None:
        try:
            rc, out, err = _run_cli(_filled(case, where))
        except Exception as exc:  # noqa: BLE001 - what the sweep counts
            return RAW, f"{type(exc).__name__}: {exc}"[:300]
        lines = err.strip().splitlines()
        if rc == 0:
            if oracle is None:
                return WRONG, f"exit 0: {out[:200]!r}"
            return (CORRECT, "") if oracle(out) else (WRONG, f"output: {out[:300]!r}")
        one_line = len(lines) == 1 and lines[0].startswith("torch_l2topo: error: ")
        usage = len(lines) >= 2 and lines[0].startswith("usage:") and ": error: " in lines[-1]  # argparse's form
        if rc == 2 and (one_line or usage) and name in lines[-1] and "Traceback" not in err:
            return (CLEAR, lines[-1]) if oracle is None else (WRONG, f"refused: {lines[-1]}")
        return RAW, f"exit {rc}: {err.strip()[-300:]!r}"
    try:
        result = case.call(case.path)
    except Exception as exc:  # noqa: BLE001 - what the sweep counts
        message = str(exc)
        if isinstance(exc, case.errors) and "\n" not in message and name in message:
            return (CLEAR, f"{type(exc).__name__}: {message}") if oracle is None else (WRONG, f"refused: {message}")
        return RAW, f"{type(exc).__name__}: {message}"[:300]
    if oracle is None:
        return WRONG, f"returned {str(result)[:200]!r}"
    return (CORRECT, "") if oracle(result) else (WRONG, f"answer: {str(result)[:300]!r}")


def sweep(cases=None, verbose: bool = True) -> Counter:
    import logging
    import tempfile
    import warnings

    logging.getLogger("torch_l2topo").setLevel(logging.ERROR)
    counts = Counter()
    with tempfile.TemporaryDirectory(prefix="l2topo-bad-") as work, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        where = prepare(Path(work))
        for case in cases or CASES:
            outcome, detail = run(case, where)
            counts[outcome] += 1
            if verbose:
                print(f"{outcome:15s} {case.id}  {detail}"[:400])
    return counts


def main(argv) -> None:
    if argv[:1] == ["build"]:
        build()
        print(f"wrote {sum(len(list((CORPUS / g).iterdir())) for g in GROUPS)} files to {CORPUS}")
        return
    counts = sweep()
    print(f"\n{sum(counts.values())} cases: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES))


if __name__ == "__main__":
    main(sys.argv[1:])
