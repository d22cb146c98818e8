"""calpipe.sklearn: scikit-learn's estimator protocol over calpipe's calibrators (#14)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold, cross_val_predict
from sklearn.utils.estimator_checks import parametrize_with_checks

from calpipe import make_calibrator
from calpipe.sklearn import CalibratedClassifier, ScoreCalibrator

#: scikit-learn's generic checks fit on random features (normal draws, counts, integers);
#: a ScoreCalibrator's input is a classifier's probabilities, so these checks refuse at the
#: input (each property they test is tested below on probabilities instead).
NOT_PROBABILITIES = "feeds features that are not probabilities in [0, 1]"
SCORE_CALIBRATOR_XFAIL = dict.fromkeys(
    ["check_classifier_data_not_an_array", "check_classifiers_classes", "check_classifiers_train",
     "check_dict_unchanged", "check_dont_overwrite_parameters", "check_dtype_object",
     "check_estimators_dtypes", "check_estimators_fit_returns_self", "check_estimators_nan_inf",
     "check_estimators_overwrite_params", "check_estimators_partial_fit_n_features",
     "check_estimators_pickle", "check_f_contiguous_array_estimator", "check_fit2d_1feature",
     "check_fit2d_1sample", "check_fit2d_predict1d", "check_fit_check_is_fitted",
     "check_fit_idempotent", "check_fit_score_takes_y", "check_methods_sample_order_invariance",
     "check_methods_subset_invariance", "check_n_features_in", "check_n_features_in_after_fitting",
     "check_pipeline_consistency", "check_readonly_memmap_input", "check_supervised_y_2d"],
    NOT_PROBABILITIES,
)  # fmt: skip


def _expected_failed(est):
    return SCORE_CALIBRATOR_XFAIL if isinstance(est, ScoreCalibrator) else {}


@parametrize_with_checks(
    [ScoreCalibrator(), CalibratedClassifier(LogisticRegression(), cv=3)],
    expected_failed_checks=_expected_failed,
)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def _binary(seed=0, n=600):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, n)
    y = (rng.uniform(size=n) < p**1.5).astype(int)
    return p, y


def test_fit_then_predict_proba_is_the_calibrators_state_after_the_rows():
    """The oracle: Calibrator.run over the rows, then its serving map (the next forecast)."""
    p, y = _binary()
    for method, params in [("composite-jumper", {}), ("platt", {"window": 200}), ("isotonic", {})]:
        est = ScoreCalibrator(method, **params).fit(p, y)
        cal = make_calibrator(method, **params)
        _, st = cal.run(p, y)
        w = np.asarray(st.weights)
        state = cal.load_state(w, np.array([0, w.size]), np.array([st.log10_martingale]), 2)
        grid = np.linspace(0, 1, 11)
        want = cal.serving_map(state, grid[None, :])[0]
        got = est.predict_proba(grid[:, None])
        np.testing.assert_array_equal(got[:, 1], want)
        np.testing.assert_allclose(got.sum(axis=1), 1.0)
        assert est.state_.n_events == p.size and est.state_.log10_martingale == st.log10_martingale


def test_the_forms_of_binary_scores_agree():
    p, y = _binary(1)
    a = ScoreCalibrator().fit(p, y).predict_proba(p[:5])
    b = ScoreCalibrator().fit(p[:, None], y).predict_proba(p[:5, None])
    c = (
        ScoreCalibrator()
        .fit(np.column_stack([1 - p, p]), y)
        .predict_proba(np.column_stack([1 - p[:5], p[:5]]))
    )
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_partial_fit_in_chunks_equals_one_fit():
    p, y = _binary(2)
    one = ScoreCalibrator().fit(p, y)
    chunks = ScoreCalibrator()
    for lo in range(0, p.size, 170):
        chunks.partial_fit(p[lo : lo + 170], y[lo : lo + 170], classes=[0, 1])
    assert chunks.state_ == one.state_
    np.testing.assert_array_equal(chunks.predict_proba(p[:20]), one.predict_proba(p[:20]))


def test_string_labels_and_multiclass():
    p, y = _binary(3)
    names = np.array(["no", "yes"])[y]
    est = ScoreCalibrator().fit(p, names)
    assert est.classes_.tolist() == ["no", "yes"]
    assert set(est.predict(p[:50])) <= {"no", "yes"}
    rng = np.random.default_rng(4)
    s = rng.dirichlet(np.ones(3), size=500)
    yk = np.array([rng.choice(3, p=row**2 / (row**2).sum()) for row in s])
    k = ScoreCalibrator().fit(s, yk)
    out = k.predict_proba(s[:7])
    assert out.shape == (7, 3) and np.allclose(out.sum(axis=1), 1.0)
    assert k.classes_.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="do not match the 3 fitted classes"):
        k.predict_proba(p[:3])


def test_bad_input_names_the_row_and_rule():
    p, y = _binary(5)
    q = p.copy()
    q[7] = 1.5
    with pytest.raises(ValueError, match="Values above 1 in data: scores row 7"):
        ScoreCalibrator().fit(q, y)
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        ScoreCalibrator().fit(p, p)
    with pytest.raises(ValueError, match=r"y has 1 distinct label\(s\)"):
        ScoreCalibrator().fit(p, np.zeros_like(y))
    est = ScoreCalibrator().fit(p, y)
    with pytest.raises(ValueError, match=r"y\[0\] = 7 is not one of the fitted classes"):
        est.partial_fit(p[:3], [7, 0, 1])
    with pytest.raises(Exception, match="unknown method 'nope'"):
        ScoreCalibrator("nope").fit(p, y)


def test_params_clone_pickle_and_idempotent_fit():
    p, y = _binary(6)
    est = ScoreCalibrator("platt", window=300, refit_every=50)
    assert est.get_params() == {"method": "platt", "base_method": None, "base_params": None,
                                "window": 300, "refit_every": 50}  # fmt: skip
    twin = clone(est).set_params(window=100)
    assert twin.get_params()["window"] == 100 and est.get_params()["window"] == 300
    assert repr(est) == "ScoreCalibrator(method='platt', refit_every=50, window=300)"
    fitted = est.fit(p, y)
    before = fitted.predict_proba(p[:30])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(fitted)).predict_proba(p[:30]), before)
    np.testing.assert_array_equal(est.fit(p, y).predict_proba(p[:30]), before)  # fit restarts
    # rows are predicted independently: order and subsets do not change a row's forecast
    perm = np.random.default_rng(0).permutation(30)
    np.testing.assert_array_equal(fitted.predict_proba(p[:30][perm]), before[perm])
    np.testing.assert_array_equal(fitted.predict_proba(p[:10]), before[:10])


def test_calibrated_classifier_is_out_of_fold_calibration_then_a_refit():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(900, 3))
    y = (X @ [1.5, -1.0, 0.5] + rng.logistic(size=900) > 0.3).astype(int)
    cv = KFold(3)
    clf = CalibratedClassifier(LogisticRegression(C=0.01), method="isotonic", cv=cv).fit(X, y)
    oof = cross_val_predict(LogisticRegression(C=0.01), X, y, cv=cv, method="predict_proba")
    want = (
        ScoreCalibrator("isotonic")
        .fit(oof, y)
        .predict_proba(LogisticRegression(C=0.01).fit(X, y).predict_proba(X[:20]))
    )
    np.testing.assert_allclose(clf.predict_proba(X[:20]), want, rtol=0, atol=1e-12)
    # prefit: the given estimator is used as it is
    base = LogisticRegression().fit(X[:450], y[:450])
    pre = CalibratedClassifier(base, method="platt", cv="prefit").fit(X[450:], y[450:])
    assert pre.estimator_ is base
    np.testing.assert_array_equal(
        pre.predict_proba(X[:5]),
        ScoreCalibrator("platt")
        .fit(base.predict_proba(X[450:]), y[450:])
        .predict_proba(base.predict_proba(X[:5])),
    )
