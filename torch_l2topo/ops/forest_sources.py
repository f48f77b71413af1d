"""Forests from the libraries that train them: fitted scikit-learn models, and xgboost's own JSON model files.

Each loader turns the library's trees into TreeArrays with the one test the kernel runs, `x <= threshold` in
float32, and keeps the library's arithmetic so that the CPU path reproduces its predictions:
- scikit-learn compares float32 inputs with float64 thresholds (`x <= t`): the float32 threshold is t rounded
  down, which gives the same answer for every float32 x. Classifier trees give their leaf class fractions
  normalized as DecisionTreeClassifier.predict_proba does; random forests sum the trees' rows from 0 and divide
  by the tree count, gradient boosting adds learning_rate x leaf value to the init estimator's raw prediction,
  stage after stage, in float64, as scikit-learn does.
- xgboost goes left when `x < split_condition` (float32): the threshold is the next float32 below it. Leaf
  values already include the learning rate; the base margin is the objective's link of base_score; sums are
  float32 in tree order from the base margin, as xgboost's CPU predictor adds them.
Neither library is imported to read an xgboost file; scikit-learn is needed only to have a model to convert.
A loader returns Forest.from_trees' keyword arguments; Forest.from_sklearn and Forest.from_xgboost_json lay them
out (this module is below forest.py: it defines TreeArrays and imports nothing of it).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..errors import ForestFormatError
from ..files import read_json

DEFAULT_LEFT = 1 << 31  # a node record's default-left bit, in the word that holds its feature index
MAX_FEATURES = DEFAULT_LEFT - 1  # so a feature index is below it

# xgboost objectives by the link from margin to prediction (and the inverse link that turns base_score into
# the base margin: xgboost's ObjFunction::ProbToMargin)
XGBOOST_IDENTITY = ("reg:squarederror", "reg:squaredlogerror", "reg:absoluteerror", "reg:pseudohubererror",
                    "reg:linear", "binary:logitraw", "rank:pairwise", "rank:ndcg", "rank:map")
XGBOOST_LOGISTIC = ("binary:logistic", "reg:logistic")
XGBOOST_EXP = ("count:poisson", "reg:gamma", "reg:tweedie")
XGBOOST_MULTICLASS = ("multi:softprob", "multi:softmax")
XGBOOST_OBJECTIVES = (*XGBOOST_IDENTITY, *XGBOOST_LOGISTIC, *XGBOOST_EXP, *XGBOOST_MULTICLASS)
# scikit-learn models whose prediction is a sum or mean of leaf values (and their subclasses); IsolationForest, also
# trees, scores by path length
SKLEARN_MODELS = ("DecisionTreeClassifier", "DecisionTreeRegressor", "ExtraTreeClassifier", "ExtraTreeRegressor",
                  "RandomForestClassifier", "RandomForestRegressor", "ExtraTreesClassifier", "ExtraTreesRegressor",
                  "GradientBoostingClassifier", "GradientBoostingRegressor")


def float32_at_most(t) -> np.ndarray:
    """The largest float32 <= t, elementwise: for every float32 x, x <= t (float64) iff x <= this."""
    t = np.asarray(t, dtype=np.float64)
    t32 = t.astype(np.float32)
    above = t32.astype(np.float64) > t
    t32[above] = np.nextafter(t32[above], np.float32(-np.inf))
    return t32


def _sklearn_tree(tree, value: np.ndarray) -> TreeArrays:
    leaf = tree.children_left < 0
    missing_left = getattr(tree, "missing_go_to_left", np.zeros(tree.node_count, dtype=np.uint8))
    return TreeArrays(feature=np.where(leaf, 0, tree.feature).astype(np.int32),
                      threshold=np.where(leaf, np.float32(0), float32_at_most(tree.threshold)),
                      default_left=np.asarray(missing_left, dtype=bool) & ~leaf,
                      left=np.where(leaf, -1, tree.children_left).astype(np.int32),
                      right=np.where(leaf, -1, tree.children_right).astype(np.int32), value=value)


class TreeArrays(NamedTuple):
    """One tree, nodes numbered from the root 0: children -1 at leaves; `value` rows are read at leaves only."""
    feature: np.ndarray        # int32
    threshold: np.ndarray      # float32: go left when x[feature] <= threshold
    default_left: np.ndarray   # bool: where NaN goes
    left: np.ndarray           # int32, -1 at a leaf
    right: np.ndarray          # int32, -1 at a leaf
    value: np.ndarray          # (n_nodes, leaf_width)


def _class_fractions(tree, n_classes: int) -> np.ndarray:
    """A classifier tree's leaf rows as DecisionTreeClassifier.predict_proba computes them."""
    proba = np.array(tree.value[:, 0, :n_classes], dtype=np.float64)
    normalizer = proba.sum(axis=1)[:, None]
    normalizer[normalizer == 0.0] = 1.0
    return proba / normalizer


def from_sklearn(model) -> dict:
    """Forest.from_trees' arguments for a fitted DecisionTree*, RandomForest*, ExtraTrees* or GradientBoosting*
    model (classifier or regressor). forest_predict then returns what predict_proba (classifiers) or predict
    (regressors) returns."""
    kind = type(model).__name__
    if not any(cls.__name__ in SKLEARN_MODELS for cls in type(model).__mro__):
        raise TypeError(f"Forest.from_sklearn takes a fitted scikit-learn tree ensemble ({', '.join(SKLEARN_MODELS)});"
                        f" got {kind}" + (": its score is a path length, not a sum of leaf values"
                                          if kind == "IsolationForest" else ""))
    if not hasattr(model, "estimators_") and not hasattr(model, "tree_"):
        raise TypeError(f"Forest.from_sklearn takes a fitted model; this {kind} is not fitted yet")
    n_features = int(model.n_features_in_)
    if kind.startswith("GradientBoosting"):
        return _sklearn_boosting(model, n_features)
    estimators = [model] if hasattr(model, "tree_") else list(model.estimators_)
    classifier = hasattr(model, "classes_")
    if classifier:
        if int(model.n_outputs_) != 1:
            raise ValueError("Forest.from_sklearn: multi-output classifiers are not supported")
        n_classes = len(model.classes_)
        trees = [_sklearn_tree(e.tree_, _class_fractions(e.tree_, n_classes)) for e in estimators]
        meta = dict(classes=tuple(model.classes_.tolist()))
        n_outputs = n_classes
    else:
        n_outputs = int(model.n_outputs_)
        trees = [_sklearn_tree(e.tree_, np.array(e.tree_.value[:, :, 0], dtype=np.float64)) for e in estimators]
        meta = dict(squeeze=n_outputs == 1)
    return dict(trees=trees, groups=np.zeros(len(trees), dtype=np.int32), base=np.zeros(n_outputs),
                n_features=n_features, divisor=float(len(trees)), **meta)


def _sklearn_boosting(model, n_features: int) -> dict:
    init = model.init_
    if not (init == "zero" or type(init).__name__ in ("DummyClassifier", "DummyRegressor")):
        raise ValueError("Forest.from_sklearn: gradient boosting with a custom init estimator is not supported "
                         f"(its raw prediction depends on x); got {type(init).__name__}")
    stages = model.estimators_  # (n_stages, K) regression trees; tree (i, k) adds to raw output k
    n_outputs = stages.shape[1]
    # the init estimator's raw prediction is one constant row: read it for any input (the private helper is
    # what predict itself calls)
    base = model._raw_predict_init(np.zeros((1, n_features), dtype=np.float32))[0]
    trees, groups = [], []
    for stage in stages:
        for k, estimator in enumerate(stage):
            trees.append(_sklearn_tree(estimator.tree_, model.learning_rate * estimator.tree_.value[:, :, 0]))
            groups.append(k)
    if hasattr(model, "classes_"):
        meta = dict(transform="sigmoid_pair" if n_outputs == 1 else "softmax", classes=tuple(model.classes_.tolist()))
    else:
        meta = dict(squeeze=True)
    return dict(trees=trees, groups=groups, base=base, n_features=n_features, **meta)


def _xgboost_floats(text) -> np.ndarray:
    """base_score as xgboost writes it: "0.5" (older files) or "[5E-1]" / "[a,b,c]" (one per output)."""
    try:
        return np.array([float(v) for v in str(text).strip("[]").split(",")], dtype=np.float32)
    except ValueError:
        raise ForestFormatError(f"base_score {text!r} is not a number or a list of numbers") from None


def _xgboost_int(params: dict, key: str, default=None, low: int = 0, high: int = MAX_FEATURES) -> int:
    """An integer xgboost writes as a string ("6") in learner_model_param, within [low, high]."""
    text = params.get(key, default)
    try:
        value = int(str(text))
    except ValueError:
        raise ForestFormatError(f"learner_model_param {key} {text!r} is not an integer") from None
    if not low <= value <= high:
        raise ForestFormatError(f"learner_model_param {key} {value} is outside [{low}, {high}]")
    return value


def _numbers(tree: dict, key: str, t: int, kinds: tuple) -> np.ndarray:
    """tree[key], a list of JSON numbers of `kinds` (int, or int and float), as int64 or float64: ForestFormatError
    for a missing key, another JSON type (true/false, strings) or an integer past 64 bits."""
    values = tree.get(key)
    if not isinstance(values, list):
        raise ForestFormatError(f"tree {t} has no {key} list")
    found = set(map(type, values)) - set(kinds)
    if found:
        raise ForestFormatError(f"tree {t}: {key} holds {', '.join(sorted(k.__name__ for k in found))} values; "
                                f"xgboost writes {' or '.join(k.__name__ for k in kinds)} there")
    try:
        return np.array(values, dtype=np.int64 if kinds == (int,) else np.float64)
    except OverflowError:
        raise ForestFormatError(f"tree {t}: {key} holds an integer too large for any index") from None


def _xgboost_tree(tree, t: int) -> TreeArrays:
    if not isinstance(tree, dict):
        raise ForestFormatError(f"tree {t} is not a JSON object")
    if str((tree.get("tree_param") or {}).get("size_leaf_vector", "1")) not in ("0", "1"):
        raise ForestFormatError("multi-target trees (vector leaves) are not supported")
    if any(v != 0 for v in tree.get("split_type") or []):
        raise ForestFormatError("categorical splits are not supported")
    left, right = _numbers(tree, "left_children", t, (int,)), _numbers(tree, "right_children", t, (int,))
    feature = _numbers(tree, "split_indices", t, (int,))
    condition = _numbers(tree, "split_conditions", t, (int, float)).astype(np.float32)  # a leaf's value at a leaf
    default_left = _numbers(tree, "default_left", t, (int,))
    if not len(left) == len(right) == len(feature) == len(condition) == len(default_left):
        raise ForestFormatError(f"tree {t}: left_children, right_children, split_indices, split_conditions and "
                                f"default_left have lengths {len(left)}, {len(right)}, {len(feature)}, "
                                f"{len(condition)}, {len(default_left)}: one per node each")
    leaf = left == -1
    # x < c  <=>  x <= the next float32 below c, for every float32 x; and x < -inf never holds, which only NaN
    # gives in <=: xgboost then goes right, as NaN thresholds (x < NaN) do too
    below = np.where(condition == -np.inf, np.float32(np.nan), np.nextafter(condition, np.float32(-np.inf)))
    return TreeArrays(feature=feature, threshold=np.where(leaf, np.float32(0), below), default_left=default_left,
                      left=left, right=right, value=np.where(leaf, condition, np.float32(0))[:, None])


def _base_margin(score: np.ndarray, objective: str) -> np.ndarray:
    """The base margin of base_score under the objective's inverse link (xgboost's ProbToMargin), or
    ForestFormatError where xgboost itself refuses the score."""
    if not np.isfinite(score).all():
        raise ForestFormatError(f"base_score {score.tolist()} is not finite")
    if objective in XGBOOST_LOGISTIC:
        if not ((score > 0) & (score < 1)).all():
            raise ForestFormatError(f"base_score {score.tolist()} must lie in (0, 1) for {objective}")
        return -np.log(np.float32(1) / score - np.float32(1))
    if objective in XGBOOST_EXP:
        if not (score > 0).all():
            raise ForestFormatError(f"base_score {score.tolist()} must be positive for {objective}")
        return np.log(score)
    return score


def from_xgboost_json(path) -> dict:
    """Forest.from_trees' arguments for a gbtree model file written by xgboost's Booster.save_model("....json").
    forest_predict then returns what Booster.predict returns (probabilities for binary:logistic and
    multi:softprob; for multi:softmax the class probabilities, whose argmax is Booster.predict's label).
    ForestFormatError naming the file for one that is not such a model."""
    doc = read_json(path, ForestFormatError, "an xgboost JSON model")
    try:
        return _xgboost_arguments(doc)
    except ValueError as exc:  # ForestFormatError, and the trees' own checks
        raise ForestFormatError(f"{path}: {exc}") from None


def _xgboost_arguments(doc: dict) -> dict:
    try:
        learner = doc["learner"]
        booster = learner["gradient_booster"]
        objective = learner["objective"]["name"]
        params = learner["learner_model_param"]
        model = booster["model"]
        trees, groups = model["trees"], model["tree_info"]
    except (KeyError, TypeError) as e:
        raise ForestFormatError(f"not an xgboost JSON model (no {e})") from None
    if booster.get("name") != "gbtree":
        raise ForestFormatError(f"booster {booster.get('name')!r} is not supported (gbtree only)")
    if objective not in XGBOOST_OBJECTIVES:
        raise ForestFormatError(f"objective {objective!r} is not supported; supported: {', '.join(XGBOOST_OBJECTIVES)}")
    if not isinstance(trees, list) or not isinstance(groups, list) or len(groups) != len(trees):
        raise ForestFormatError("trees and tree_info must be lists of one entry per tree")
    if set(map(type, groups)) - {int}:
        raise ForestFormatError("tree_info must hold integers (each tree's output)")
    n_outputs = max(_xgboost_int(params, "num_class", "0"), 1)
    n_features = _xgboost_int(params, "num_feature", low=1)
    score = _xgboost_floats(params.get("base_score"))
    if score.size not in (1, n_outputs):
        raise ForestFormatError(f"base_score has {score.size} values for {n_outputs} outputs")
    base = np.broadcast_to(_base_margin(score, objective), (n_outputs,)).astype(np.float32)
    if objective in XGBOOST_MULTICLASS:
        meta = dict(transform="softmax", classes=tuple(range(n_outputs)))
    else:
        transform = "sigmoid" if objective in XGBOOST_LOGISTIC else "exp" if objective in XGBOOST_EXP else "identity"
        meta = dict(transform=transform, squeeze=True)
    return dict(trees=[_xgboost_tree(tree, t) for t, tree in enumerate(trees)], groups=groups, base=base,
                n_features=n_features, dtype=torch.float32, **meta)
