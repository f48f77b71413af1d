"""Every command and loader on every bad input of tests/data/bad/ (tests/bad_inputs.py builds the corpus and says
what each file is): a clear error (one line naming the file or argument; exit 2 and one stderr line on the command
line, no traceback; the package's error type for a file) or, for an odd but valid input, the right answer."""
import json

import numpy as np
import pytest
from bad_inputs import CASES, CLEAR, CORPUS, CORRECT, GROUPS, XGBOOST, prepare, run, xgboost_reference


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_input_is_refused_clearly_or_answered_right(case, where):
    outcome, detail = run(case, where)
    assert outcome == (CORRECT if case.oracle else CLEAR), detail


def test_every_corpus_file_is_fed_to_something():
    used = {c.file for c in CASES if c.file}
    files = {f"{group}/{p.name}" for group in GROUPS for p in (CORPUS / group).iterdir()}
    assert files == used and len(files) > 130
    assert sum(c.argv is not None for c in CASES) > 300  # the command line's cases, every verb that reads a file
    verbs = {c.argv[0] for c in CASES if c.argv}
    assert verbs >= {"show", "report", "enroll", "identify", "fleet", "trace-summary", "geometry"}


@pytest.mark.parametrize("case", ["regression_d3", "binary_d6_nan", "poisson_d5"])
def test_the_xgboost_oracle_reproduces_xgboost(case):
    """The sweep's stand-in for xgboost (bad_inputs.xgboost_reference) gives xgboost's recorded predictions."""
    doc = json.loads((XGBOOST / f"{case}.json").read_text())
    recorded = np.load(XGBOOST / f"{case}.npz")
    np.testing.assert_allclose(xgboost_reference(doc, recorded["x"]), recorded["prediction"], rtol=2e-6)


def test_the_corpus_builder_is_the_corpus(tmp_path):
    """`python tests/bad_inputs.py build` writes exactly the committed files."""
    from bad_inputs import build

    build(tmp_path)
    for group in GROUPS:
        names = sorted(p.name for p in (CORPUS / group).iterdir())
        assert sorted(p.name for p in (tmp_path / group).iterdir()) == names
        for path in (CORPUS / group).iterdir():
            assert path.read_bytes() == (tmp_path / group / path.name).read_bytes(), path.name
