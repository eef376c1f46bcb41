"""Cross-fitted linear readouts of an uncertainty target from activations, on arrays.

The *readout* half of the readout-versus-mediator question (METHODS.md §13): how well can a
linear map read the target y (the exact Bayes entropy, the posterior log-odds or the model's own
entropy) from final-token activations X ``[n, d]``, on prompts it was not fitted on? Three
estimators, one protocol:

* ``"ridge"`` — ridge regression of the column-standardized X onto y (the penalty chosen by
  efficient leave-one-out inside each training fold, :class:`sklearn.linear_model.RidgeCV`), as the
  wind tunnel's ``entropy_axis`` fits its axis (there: half the rows, here K folds). Its direction in
  activation space is u ∝ w / σ (w the standardized weights, σ the training scales), the map that
  makes v·u an affine function of the fitted prediction.
* ``"pca"`` — PC1 of the standardized training rows (Paper A's axis, METHODS.md §7) mapped back
  to activation space, then y regressed on the one coordinate.
* ``"basis"`` — a given ``[d, k]`` basis (a subspace's coordinates): y regressed on its one coordinate
  by least squares (k = 1), or by the ridge above on its k coordinates (k > 1: the frame's top-k PCs, a
  head's d_head coordinates, user bases).

Cross-fitting: the prompts are split into K folds (stratified by a label such as SULA's k when
given); each fold's predictions come from a fit on the other K − 1 folds, so no prompt is scored by a
map fitted on it. The held-out R² = 1 − Σ(y − ŷ)² / Σ(y − ȳ)² over all prompts carries a percentile
bootstrap interval over prompts (the held-out pairs resampled) and a shuffled-target null: the whole
cross-fit repeated with y permuted (``n_null`` times), its 95th percentile the null threshold and
(1 + #{null ≥ observed}) / (1 + n_null) the p-value.

Example
-------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(80, 6)); y = X[:, 0] + 0.1 * rng.normal(size=80)
>>> fit = cross_fitted_readout(X, y, estimator="ridge", folds=5, n_boot=200, n_null=20)
>>> round(fit.r2.value, 2) > 0.9, fit.readable
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sklearn.base import clone

import numpy as np

from .._results import Estimate
from .._validate import check_choice, check_count, check_seed
from ..errors import InvalidInputError, NonFiniteError
from ..estimators import FixedBasis, SubspaceEstimator, cross_fit, estimator_for, fold_ids, standardized_pc_basis
from ..metrics.stats import bootstrap_indices, keyed_rng, percentile_interval, spearman
from ._rules import readable as readable_rule

__all__ = ["Readout", "cross_fitted_readout", "fold_ids", "standardized_pc_basis", "ESTIMATORS"]

ESTIMATORS = ("ridge", "pca", "basis")


def _crossfit(x, y, folds_of, estimator):
    """(held-out predictions, {fold: raw-space unit direction or None}) of one cross-fit."""
    pred, fitted = cross_fit(estimator, x, y, folds_of)
    return pred, {f: _direction(est) for f, est in fitted.items()}


def _direction(est) -> Optional[np.ndarray]:
    """A rank-one estimator's unit direction (None for a multi-dimensional subspace, or no direction)."""
    b = getattr(est, "basis_", None)
    return None if b is None or b.shape[1] != 1 or isinstance(est, FixedBasis) else b[:, 0]


def _r2(y, pred) -> float:
    sst = float(((y - y.mean()) ** 2).sum())
    return float("nan") if sst == 0 else 1.0 - float(((y - pred) ** 2).sum()) / sst


@dataclass(frozen=True, eq=False)
class Readout:
    """A cross-fitted readout: ``r2`` (held-out R², :class:`~bayes_lens.Estimate` with its bootstrap interval
    and the shuffled-target null's 95% range), ``rho`` (Spearman of held-out prediction and target),
    ``null_r2_q95`` (the null's 95th percentile), ``p_value`` (shuffled-target permutation p), ``predictions``
    ``[n]`` (held out), ``folds`` ``[n]``, ``fold_directions`` (fold → unit vector in activation space, or None
    for a multi-dimensional basis: the direction fitted without that fold's rows), ``direction`` (fitted
    on every row), ``estimator``, ``readable`` (the rule: R²'s interval lies above both the null's 95th
    percentile and ``min_r2``)."""

    estimator: str
    r2: Estimate
    rho: float
    null_r2_q95: float
    p_value: float
    min_r2: float
    predictions: np.ndarray
    folds: np.ndarray
    fold_directions: dict
    direction: Optional[np.ndarray]

    @property
    def readable(self) -> bool:
        return readable_rule(self.r2.ci_low, self.null_r2_q95, self.min_r2)


def cross_fitted_readout(X, y, *, estimator: str = "ridge", basis=None, folds: int = 5, strata=None,
                         n_boot: int = 1000, n_null: int = 100, min_r2: float = 0.1, seed: int = 0) -> Readout:
    """Cross-fitted readout of ``y`` ``[n]`` from ``X`` ``[n, d]`` (see the module docstring for the maths).

    ``estimator``: ``"ridge"``, ``"pca"`` or ``"basis"`` (with ``basis`` ``[d, k]``); ``folds`` ≥ 2 (K);
    ``strata`` ``[n]`` labels to stratify the folds and the bootstrap by; ``n_null`` shuffled-target refits
    (0 skips the null: p-value and threshold NaN, and nothing is called readable); ``min_r2`` the smallest
    held-out R² called a readout.

    >>> import numpy as np
    >>> X = np.random.default_rng(1).normal(size=(40, 3))
    >>> cross_fitted_readout(X, X @ [1.0, 0, 0], estimator="basis", basis=np.eye(3)[:, :1], n_null=0).r2.value
    1.0
    """
    if not isinstance(estimator, SubspaceEstimator):
        check_choice(estimator, "estimator (or a bl.estimators estimator such as PLSSubspace(rank=k))", ESTIMATORS)
    folds = check_count(folds, "folds")
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    n_null = check_count(n_null, "n_null", allow_zero=True)
    seed = check_seed(seed)
    x = np.asarray(X, dtype=np.float64)
    yy = np.asarray(y, dtype=np.float64).ravel()
    if x.ndim != 2 or x.shape[0] != yy.shape[0]:
        raise InvalidInputError(f"X must be [n, d] with one target per row; got X {list(x.shape)} and y "
                                f"{list(yy.shape)}.")
    if x.shape[0] < 2 * folds:
        raise InvalidInputError(f"{folds}-fold cross-fitting needs at least {2 * folds} rows, got {x.shape[0]}: "
                                "pass more prompts or fewer folds.")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(yy))):
        raise NonFiniteError("X and y must be finite (NaN or infinity found).")
    if estimator == "basis":
        if basis is None:
            raise InvalidInputError("estimator='basis' needs basis= ([d, k]).")
        b = np.asarray(basis, dtype=np.float64)
        b = b[:, None] if b.ndim == 1 else b
        if b.ndim != 2 or b.shape[0] != x.shape[1]:
            raise InvalidInputError(f"basis must be [d, k] with d = {x.shape[1]}, got {list(np.shape(basis))}.")
        basis = b
    est = estimator_for(estimator, basis=basis)
    fid = fold_ids(x.shape[0], folds, seed=seed, strata=strata)
    pred, dirs = _crossfit(x, yy, fid, est)
    r2 = _r2(yy, pred)
    nulls = np.array([_r2(yp, cross_fit(est, x, yp, fid)[0])
                      for yp in (keyed_rng(seed, 72, i).permutation(yy) for i in range(n_null))])
    if n_null:
        q95 = float(np.quantile(nulls, 0.95))
        p = float((1 + np.sum(nulls >= r2)) / (1 + n_null))
        null_iv = (float(np.quantile(nulls, 0.025)), q95)
    else:
        q95 = p = float("nan")
        null_iv = (float("nan"), float("nan"))
    ci = (float("nan"), float("nan"))
    if n_boot:
        idx = bootstrap_indices(len(yy), n_boot, seed=seed, strata=strata)
        yb, pb = yy[idx], pred[idx]
        sst = ((yb - yb.mean(1, keepdims=True)) ** 2).sum(1)
        reps = np.where(sst > 0, 1.0 - ((yb - pb) ** 2).sum(1) / np.where(sst > 0, sst, 1.0), np.nan)
        ci = percentile_interval(reps)
    direction = _direction(clone(est).fit(x, yy))
    r2_est = Estimate(r2, ci, "percentile bootstrap over prompts (95%) of the held-out R²",
                   null=float(np.median(nulls)) if n_null else None,
                   null_interval=null_iv if n_null else None, n=int(len(yy)))
    return Readout(estimator=estimator if isinstance(estimator, str) else est.name, r2=r2_est, rho=spearman(pred, yy), null_r2_q95=q95, p_value=p,
                   min_r2=float(min_r2), predictions=pred, folds=fid, fold_directions=dirs, direction=direction)
