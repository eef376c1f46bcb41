"""Cross-fitting, written once: stratified folds and held-out predictions of any subspace estimator.

METHODS.md §13. The prompts are split into K folds, dealt round-robin after a seeded shuffle within
each stratum (SULA's evidence count k), so each fold holds every stratum in proportion; each fold's
predictions (and its subspace) come from a fit on the other K − 1 folds (:func:`sklearn.base.clone`
of the estimator), so no prompt is scored, or intervened on, by a map fitted on it.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
from sklearn.base import clone

from ..metrics.stats import keyed_rng

__all__ = ["fold_ids", "cross_fit"]


def fold_ids(n: int, folds: int, *, seed=0, strata=None) -> np.ndarray:
    """``[n]`` fold number of each row: a seeded shuffle dealt round-robin, within each stratum when given
    (so each fold holds every stratum in proportion).

    >>> fold_ids(6, 3, seed=0).tolist().count(0)
    2
    """
    rng = keyed_rng(seed, 71)
    out = np.empty(n, dtype=np.int64)
    groups = [np.arange(n)] if strata is None else [np.flatnonzero(np.asarray(strata) == s)
                                                     for s in np.unique(np.asarray(strata))]
    start = 0
    for g in groups:
        perm = rng.permutation(g)
        out[perm] = (np.arange(len(perm)) + start) % folds
        start += len(perm)
    return out


def cross_fit(estimator, X: np.ndarray, y: np.ndarray, folds_of: np.ndarray) -> Tuple[np.ndarray, Dict[int, object]]:
    """(held-out predictions ``[n]``, ``{fold: the clone fitted without that fold}``) of ``estimator`` on
    ``(X, y)`` with the folds ``folds_of`` ``[n]``.

    >>> from bayes_lens.estimators import RidgeAxis
    >>> X = np.random.default_rng(0).normal(size=(30, 3)); y = X[:, 0]
    >>> pred, fitted = cross_fit(RidgeAxis(), X, y, fold_ids(30, 3))
    >>> sorted(fitted), pred.shape
    ([0, 1, 2], (30,))
    """
    pred = np.empty(len(y), dtype=np.float64)
    fitted = {}
    for f in np.unique(folds_of):
        te = folds_of == f
        est = clone(estimator).fit(X[~te], y[~te])
        pred[te] = est.predict(X[te])
        fitted[int(f)] = est
    return pred, fitted
