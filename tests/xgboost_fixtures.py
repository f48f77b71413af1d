"""Writes the xgboost fixtures of tests/test_ops_forest.py: small models saved in xgboost's own JSON format, with
xgboost's own predictions on fixed inputs as the recorded oracle (so the tests need no xgboost).

    python tests/xgboost_fixtures.py        # rewrites tests/data/xgboost/ (needs xgboost: pip install xgboost-cpu)

tests/data/xgboost/manifest.json records the xgboost and numpy versions and this command. Each case: a model
`<case>.json` and `<case>.npz` with x (float32 inputs, some NaN where the case says so), prediction
(Booster.predict) and margin (Booster.predict(output_margin=True)).
"""
import datetime as dt
import json
import platform
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "data" / "xgboost"
N_FEATURES = 6
# case: (objective, classes, rounds, max_depth, training rows, NaN share of the inputs)
CASES = {
    "regression_d3": ("reg:squarederror", 0, 20, 3, 400, 0.0),
    "binary_d6_nan": ("binary:logistic", 2, 25, 6, 600, 0.1),
    "multiclass_d4": ("multi:softprob", 3, 8, 4, 500, 0.05),
    "softmax_d2": ("multi:softmax", 4, 6, 2, 300, 0.0),
    "poisson_d5": ("count:poisson", 0, 12, 5, 400, 0.0),
    "regression_d9": ("reg:squarederror", 0, 4, 9, 1500, 0.0),
}
N_TEST = 256


def _data(rng, objective: str, rows: int, classes: int, nan_share: float):
    x = rng.normal(size=(rows, N_FEATURES)).astype(np.float32)
    x[:, 5] = np.round(x[:, 5])  # a feature with repeated values: thresholds sit exactly between them
    signal = x[:, 0] + 0.5 * x[:, 1] * x[:, 2] - x[:, 3] ** 2 + 0.3 * x[:, 5]
    if classes:
        y = np.digitize(signal, np.quantile(signal, np.linspace(0, 1, classes + 1)[1:-1]))
    else:
        y = np.exp(0.3 * signal) if objective == "count:poisson" else signal  # counts' rate: positive
    if nan_share:
        x[rng.random(x.shape) < nan_share] = np.nan
    return x, y


def main():
    import xgboost as xgb

    rng = np.random.default_rng(20)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (objective, classes, rounds, depth, rows, nan_share) in CASES.items():
        x, y = _data(rng, objective, rows, classes, nan_share)
        params = {"objective": objective, "max_depth": depth, "eta": 0.3, "seed": 0}
        if objective.startswith("multi"):
            params["num_class"] = classes
        booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=rounds)
        booster.save_model(str(OUT / f"{name}.json"))
        x_test, _ = _data(rng, objective, N_TEST, classes, nan_share)
        test = xgb.DMatrix(x_test)
        np.savez_compressed(OUT / f"{name}.npz", x=x_test, prediction=booster.predict(test),
                            margin=booster.predict(test, output_margin=True))
    manifest = {"xgboost": xgb.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "date": dt.date.today().isoformat(), "command": "python " + " ".join(sys.argv),
                "cases": {k: dict(zip(("objective", "classes", "rounds", "max_depth", "rows", "nan_share"), v))
                          for k, v in CASES.items()}}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(CASES)} cases to {OUT}")


if __name__ == "__main__":
    main()
