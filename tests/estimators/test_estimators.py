"""bl.estimators: the array estimators against scikit-learn's own fits and closed forms, the scikit-learn
protocol (get_params, clone), cross-fitting, and a new estimator (PLS) reaching bl.localize as one class."""

import numpy as np
import pytest
from sklearn.base import clone

import bayes_lens as bl
from bayes_lens.errors import InvalidInputError
from bayes_lens.estimators import (ALPHAS, FixedBasis, PC1Axis, PLSSubspace, RidgeAxis, TopKFrame, cross_fit,
                                   fold_ids)


def _data(n=80, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * np.arange(1, d + 1)
    y = X[:, 2] - 0.5 * X[:, 4] + 0.1 * rng.normal(size=n)
    return X, y


@pytest.mark.parametrize("est", [RidgeAxis(), PC1Axis(), TopKFrame(rank=3), FixedBasis(np.eye(6)[:, :2]),
                                 PLSSubspace(rank=2)])
def test_the_scikit_learn_protocol(est):
    X, y = _data()
    params = est.get_params()
    twin = clone(est)
    assert twin.get_params().keys() == params.keys() and twin is not est
    assert not hasattr(twin, "basis_")  # no work in __init__
    fitted = twin.fit(X, y)
    assert fitted is twin
    b = fitted.basis_
    assert b.ndim == 2 and b.shape[0] == X.shape[1]
    if not isinstance(est, FixedBasis):
        np.testing.assert_allclose(b.T @ b, np.eye(b.shape[1]), atol=1e-10)
    assert fitted.predict(X).shape == (len(y),)


def test_ridge_axis_is_scikit_learns_standardized_ridge():
    from sklearn.linear_model import RidgeCV

    X, y = _data()
    est = RidgeAxis().fit(X, y)
    sd = X.std(0, ddof=1)
    ref = RidgeCV(alphas=ALPHAS).fit((X - X.mean(0)) / sd, y)
    w = ref.coef_ / sd
    np.testing.assert_allclose(est.basis_[:, 0], w / np.linalg.norm(w), atol=1e-12)
    np.testing.assert_allclose(est.predict(X[:5]), ref.predict((X[:5] - X.mean(0)) / sd), atol=1e-12)


def test_pc1_axis_is_the_top_eigenvector_of_the_standardized_covariance():
    X, y = _data()
    z = (X - X.mean(0)) / X.std(0, ddof=1)
    vals, vecs = np.linalg.eigh(np.cov(z.T))
    u = vecs[:, -1] / X.std(0, ddof=1)
    u /= np.linalg.norm(u)
    got = PC1Axis().fit(X, y).basis_[:, 0]
    assert abs(abs(got @ u) - 1) < 1e-10
    c = (X - X.mean(0)) @ got
    assert np.corrcoef(c, y)[0, 1] >= 0  # signed to read y positively
    # the one PC1: EntropyAxis's axis_from_pca is this function
    from bayes_lens.ablation._axis import axis_from_pca

    assert axis_from_pca is bl.estimators.pc1_axis


def test_pls_subspace_is_scikit_learns_pls():
    from sklearn.cross_decomposition import PLSRegression

    X, y = _data()
    est = PLSSubspace(rank=2).fit(X, y)
    ref = PLSRegression(n_components=2, scale=True).fit(X, y)
    np.testing.assert_allclose(est.predict(X), ref.predict(X).ravel(), atol=1e-10)
    # the basis spans the scores' directions in activation space: T = X_centred @ basis @ M for some M
    T = ref.transform(X)
    coef, *_ = np.linalg.lstsq((X - X.mean(0)) @ est.basis_, T, rcond=None)
    np.testing.assert_allclose((X - X.mean(0)) @ est.basis_ @ coef, T, atol=1e-8)
    with pytest.raises(InvalidInputError, match="rank"):
        PLSSubspace(rank=0).fit(X, y)


def test_cross_fit_predicts_each_fold_from_the_others():
    X, y = _data()
    strata = np.repeat(np.arange(4), 20)
    f = fold_ids(len(y), 5, seed=1, strata=strata)
    for s in range(4):  # stratified: each fold holds every stratum in proportion
        assert np.bincount(f[strata == s], minlength=5).tolist() == [4] * 5
    pred, fitted = cross_fit(RidgeAxis(), X, y, f)
    for k, est in fitted.items():
        te = f == k
        ref = clone(RidgeAxis()).fit(X[~te], y[~te])
        np.testing.assert_allclose(pred[te], ref.predict(X[te]))
        np.testing.assert_allclose(est.basis_, ref.basis_)


def test_a_new_estimator_reaches_localize_as_one_class():
    """PLS needs nothing in bl.localize: the estimator instance is a candidate, cross-fitted, with its readout,
    interventions and random band of its rank."""
    model = bl.models.tiny.tiny_model("bridge")
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=6)
    loc = bl.localize(model, items, layers=[1], ranks=(2,), estimators=("ridge", PLSSubspace(rank=2)), n_random=2,
                      folds=3, n_boot=30, n_null=3, swap=False, progress=False)
    t = loc.to_dataframe()
    row = t[t["subspace"] == "pls k=2"].iloc[0]
    assert row["kind"] == "estimator" and row["rank"] == 2 and np.isfinite(row["r2"])
    assert np.isfinite(row["delta_mae_bits"]) and np.isfinite(row["band_high"])
    assert ((t["kind"] == "random") & (t["rank"] == 2)).sum() == 2 * 2  # 2 draws of each null (Haar, covariance)
    assert row["null"] == "cov"  # a fitted subspace is tested against the null drawn like it
