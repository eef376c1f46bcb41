"""Estimators on arrays: ``fit(X, y)`` → ``basis_`` ``[d, k]``, the candidate subspaces a readout or a mediator test starts from.

METHODS.md §7 and §13. The scikit-learn shape (parameters in ``__init__``, ``fit`` returns self,
fitted attributes end in ``_``, ``get_params``/``clone`` work): :class:`RidgeAxis` (the wind tunnel's
entropy axis), :class:`PC1Axis` (Paper A's axis, the one PC1 of the package, shared with
:class:`bayes_lens.EntropyAxis`), :class:`TopKFrame` (the top-k standardized PCs), :class:`FixedBasis`
(a given subspace), :class:`PLSSubspace` (rank-k partial least squares, scikit-learn's
``PLSRegression``). Each also predicts y (``predict``), which the held-out readout scores; cross-fitting
is written once (:func:`cross_fit`, folds stratified by the task's evidence count, :func:`fold_ids`).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(60, 5)); y = X[:, 0] + 0.1 * rng.normal(size=60)
>>> RidgeAxis().fit(X, y).basis_.shape, PLSSubspace(rank=2).fit(X, y).basis_.shape
((5, 1), (5, 2))
"""

from ._linear import (ALPHAS, FixedBasis, PC1Axis, PLSSubspace, RidgeAxis, SubspaceEstimator, TopKFrame, estimator_for,
                      pc1_axis, standardized_pc_basis)
from ._crossfit import cross_fit, fold_ids

__all__ = ["ALPHAS", "SubspaceEstimator", "RidgeAxis", "PC1Axis", "TopKFrame", "FixedBasis", "PLSSubspace", "estimator_for",
           "cross_fit", "fold_ids", "pc1_axis", "standardized_pc_basis"]
