"""The linear subspace estimators: ridge axis, PC1, the top-k frame, a fixed basis, rank-k PLS.

METHODS.md §7 (PC1 of the standardized values mapped back, u ∝ w/σ) and §13 (the readout):

* :class:`RidgeAxis` — ridge regression of the column-standardized X onto y (the penalty by efficient
  leave-one-out, :class:`sklearn.linear_model.RidgeCV`); its direction u ∝ w/σ makes v·u an affine
  function of the prediction.
* :class:`PC1Axis` — PC1 of the (standardized) rows mapped back to activation space
  (:func:`pc1_axis`), y regressed on its one coordinate by least squares; signed to read y positively.
* :class:`TopKFrame` — the span of the top-k standardized PCs (:func:`standardized_pc_basis`); y read by
  the ridge above on its k coordinates (k = 1: least squares).
* :class:`FixedBasis` — a given ``[d, k]`` subspace, read as the frame is.
* :class:`PLSSubspace` — rank-k partial least squares (:class:`sklearn.cross_decomposition.PLSRegression`,
  scaled): the X weights mapped back to activation space (÷σ) and orthonormalized; y predicted by the PLS
  regression itself.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from sklearn.base import BaseEstimator

from .._validate import check_choice
from ..errors import InvalidInputError
from ..metrics.pca import pca

__all__ = ["SubspaceEstimator", "RidgeAxis", "PC1Axis", "TopKFrame", "FixedBasis", "PLSSubspace", "estimator_for",
           "pc1_axis", "standardized_pc_basis", "ALPHAS"]

ALPHAS = np.logspace(-3, 4, 15)


def _scales(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    mean = x.mean(0)
    sd = x.std(0, ddof=1)
    return mean, np.where(sd > 1e-12 * max(1.0, float(np.abs(x).max())), sd, np.inf)


def pc1_axis(x: np.ndarray, standardize: str = "std") -> Tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(u raw-space unit vector, mean, per-coordinate scale, explained-variance ratio of PC1): the package's one PC1.

    ``x`` is [n, d] float64. "raw": PC1 of centred x. "std": PC1 w of z-scored x (zero-variance
    coordinates dropped, :func:`bayes_lens.metrics.pca.pca`), mapped back u ∝ w / σ. The
    explained-variance ratio is in the space where the PCA was run.
    """
    fit = pca(x, 1, standardized=(standardize == "std"))
    w = fit.components[0]
    if standardize == "std":
        u = np.zeros(x.shape[1])
        u[fit.kept] = w / fit.scale[fit.kept]
        scale = fit.scale
    else:
        u = w
        scale = np.ones(x.shape[1])
    return u / np.linalg.norm(u), fit.mean, scale, float(fit.explained_variance_ratio[0])


def standardized_pc_basis(x: np.ndarray, k: int) -> np.ndarray:
    """``[d, k]`` orthonormal basis of the span of the top-k standardized PCs of ``x`` mapped back to
    activation space (w / σ for each PC w; QR-orthonormalized, so projecting onto it removes exactly
    that span). PC signs are arbitrary."""
    fit = pca(x, k, standardized=True)
    b = np.zeros((x.shape[1], fit.components.shape[0]))
    b[fit.kept] = fit.components.T / fit.scale[fit.kept, None]
    q, _ = np.linalg.qr(b)
    return q


def _lstsq_fit(c: np.ndarray, y: np.ndarray) -> np.ndarray:
    design = np.column_stack([np.ones(len(c)), c])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return coef


def _lstsq_predict(coef: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(c)), c]) @ coef


class SubspaceEstimator(BaseEstimator):
    """The shape every candidate-subspace estimator has: ``fit(X [n, d], y [n]) -> self`` setting ``basis_``
    ``[d, k]`` (orthonormal columns; a rank-one estimator's column signed to read y positively) and
    ``predict(X) -> [n]``. ``name`` labels its row in a table; ``rank`` is k."""

    rank: int = 1

    @property
    def name(self) -> str:
        return type(self).__name__

    def _check(self, X, y=None):
        x = np.asarray(X, dtype=np.float64)
        if x.ndim != 2:
            raise InvalidInputError(f"X must be [n, d], got shape {list(x.shape)}.")
        if y is None:
            return x, None
        yy = np.asarray(y, dtype=np.float64).ravel()
        if yy.shape[0] != x.shape[0]:
            raise InvalidInputError(f"X has {x.shape[0]} rows but y has {yy.shape[0]}; one target per row.")
        return x, yy

    def fit_basis(self, X, y) -> np.ndarray:
        """``basis_`` of a fit on ``(X, y)`` (the estimator itself is left unfitted: a clone is fitted)."""
        from sklearn.base import clone

        return clone(self).fit(X, y).basis_


class RidgeAxis(SubspaceEstimator):
    """Ridge regression of the standardized rows onto y (:class:`~sklearn.linear_model.RidgeCV` over ``alphas``);
    ``basis_`` ``[d, 1]`` the direction w/σ normalized (None when every weight is 0)."""

    def __init__(self, alphas=None):
        self.alphas = alphas

    @property
    def name(self) -> str:
        return "ridge axis"

    def fit(self, X, y):
        from sklearn.linear_model import RidgeCV

        x, yy = self._check(X, y)
        self.mean_, self.scale_ = _scales(x)
        self.model_ = RidgeCV(alphas=ALPHAS if self.alphas is None else self.alphas).fit((x - self.mean_) / self.scale_,
                                                                                          yy)
        u = self.model_.coef_ / self.scale_
        norm = np.linalg.norm(u)
        self.basis_ = (u / norm)[:, None] if norm > 0 else None
        return self

    def predict(self, X):
        x, _ = self._check(X)
        return self.model_.predict((x - self.mean_) / self.scale_)


class PC1Axis(SubspaceEstimator):
    """PC1 of the rows (``standardize="std"``: of the z-scored rows, mapped back u ∝ w/σ; ``"raw"``), :func:`pc1_axis`;
    y regressed on its coordinate by least squares, ``basis_`` signed to read y positively (unsigned without y)."""

    def __init__(self, standardize: str = "std"):
        self.standardize = standardize

    @property
    def name(self) -> str:
        return "pca axis"

    def fit(self, X, y=None):
        x, yy = self._check(X, y)
        u, _, _, self.explained_variance_ratio_ = pc1_axis(x, self.standardize)
        self.u_, self.center_ = u, x.mean(0)
        if yy is None:
            self.coef_ = None
            self.basis_ = u[:, None]
            return self
        self.coef_ = _lstsq_fit((x - self.center_) @ u[:, None], yy)
        self.basis_ = (u * (1.0 if self.coef_[1] >= 0 else -1.0))[:, None]
        return self

    def predict(self, X):
        x, _ = self._check(X)
        return _lstsq_predict(self.coef_, (x - self.center_) @ self.u_[:, None])


class _SubspaceReader(SubspaceEstimator):
    """Reads y from a subspace's coordinates: least squares on the one coordinate (k = 1), else the ridge of
    :class:`RidgeAxis` on the k coordinates."""

    def _fit_readout(self, x, yy):
        b = self.basis_
        if b.shape[1] > 1:
            self.reader_ = RidgeAxis().fit(x @ b, yy)
            self.coef_ = None
        else:
            self.reader_ = None
            self.center_ = x.mean(0)
            self.coef_ = _lstsq_fit((x - self.center_) @ b, yy)

    def predict(self, X):
        x, _ = self._check(X)
        if self.reader_ is not None:
            return self.reader_.predict(x @ self.basis_)
        return _lstsq_predict(self.coef_, (x - self.center_) @ self.basis_)


class FixedBasis(_SubspaceReader):
    """A given ``[d, k]`` subspace (``basis``, used as given), read from its coordinates."""

    def __init__(self, basis=None):
        self.basis = basis

    @property
    def name(self) -> str:
        return f"basis k={np.asarray(self.basis).reshape(np.shape(self.basis)[0], -1).shape[1]}"

    def fit(self, X, y):
        x, yy = self._check(X, y)
        if self.basis is None:
            raise InvalidInputError("FixedBasis needs basis= ([d, k]).")
        b = np.asarray(self.basis, dtype=np.float64)
        b = b[:, None] if b.ndim == 1 else b
        if b.ndim != 2 or b.shape[0] != x.shape[1]:
            raise InvalidInputError(f"basis must be [d, k] with d = {x.shape[1]}, got {list(np.shape(self.basis))}.")
        self.basis_ = b
        self._fit_readout(x, yy)
        return self


class TopKFrame(_SubspaceReader):
    """The span of the top-``rank`` standardized PCs of the rows (:func:`standardized_pc_basis`), read from its
    coordinates as :class:`FixedBasis` is."""

    def __init__(self, rank: int = 4):
        self.rank = rank

    @property
    def name(self) -> str:
        return f"frame k={self.rank}"

    def fit(self, X, y=None):
        x, yy = self._check(X, y)
        self.basis_ = standardized_pc_basis(x, int(self.rank))
        if yy is not None:
            self._fit_readout(x, yy)
        return self


class PLSSubspace(SubspaceEstimator):
    """Rank-``rank`` partial least squares of y on the rows (:class:`sklearn.cross_decomposition.PLSRegression`,
    ``scale=True``): ``basis_`` the span of the X weights (rotations) mapped back to activation space (÷σ),
    orthonormalized; ``predict`` the PLS regression's."""

    def __init__(self, rank: int = 2):
        self.rank = rank

    @property
    def name(self) -> str:
        return f"pls k={self.rank}"

    def fit(self, X, y):
        from sklearn.cross_decomposition import PLSRegression

        x, yy = self._check(X, y)
        k = int(self.rank)
        if not 1 <= k <= min(x.shape):
            raise InvalidInputError(f"PLSSubspace(rank={self.rank}) needs 1 ≤ rank ≤ min(n, d) = {min(x.shape)}.")
        self.model_ = PLSRegression(n_components=k, scale=True).fit(x, yy)
        sd = x.std(0, ddof=1)  # the scale PLSRegression(scale=True) divides by (0 read as 1)
        q = np.linalg.qr(self.model_.x_rotations_ / np.where(sd > 0, sd, 1.0)[:, None])[0]
        if k == 1:  # one direction: signed to read y positively
            c = (x - x.mean(0)) @ q[:, 0]
            q = q if float((c - c.mean()) @ (yy - yy.mean())) >= 0 else -q
        self.basis_ = q
        return self

    def predict(self, X):
        x, _ = self._check(X)
        return np.asarray(self.model_.predict(x), dtype=np.float64).ravel()


def estimator_for(spec, *, basis=None) -> SubspaceEstimator:
    """The estimator a spelling names: ``"ridge"`` → :class:`RidgeAxis`, ``"pca"`` → :class:`PC1Axis`,
    ``"basis"`` → :class:`FixedBasis` (``basis``), or an estimator instance as it is."""
    if isinstance(spec, SubspaceEstimator):
        return spec
    check_choice(spec, "estimator (or a bl.estimators estimator such as PLSSubspace(rank=k))", ("ridge", "pca", "basis"))
    return FixedBasis(basis) if spec == "basis" else {"ridge": RidgeAxis, "pca": PC1Axis}[spec]()
