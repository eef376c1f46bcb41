"""Exact reference predictors over symbol sequences (Paper B v3, METHODS.md §8b).

Paper B v3 ("LLMs are Bayesian, In Expectation, Not in Realization", arXiv 2507.11768v3) scores a
model's in-context predictive against exact Bayesian references. Each reference here is a *sequence
predictor*: a callable mapping an int array ``[n_seq, L]`` of symbols 0 … K−1 to the per-position
predictive distributions ``[n_seq, L, K]`` (row t: the distribution of x_{t+1} given x_1 … x_t).

* :func:`dirichlet_categorical` — the Dirichlet(α, …, α)–categorical posterior predictive
  (c_k + α)/(t + Kα) (:func:`bayes_lens.tasks.dirichlet_predictive`, METHODS.md §6b, at every prefix); K = 2, α = ½ is Krichevsky–Trofimov (:data:`kt`), α = 1 Laplace's rule.
  Its sequence probability has the closed form (:func:`dirichlet_log_marginal`)
  Γ(Kα)/Γ(n + Kα) · Π_k Γ(c_k + α)/Γ(α).
* :func:`plugin_mle` — the frequentist plug-in baseline: the empirical frequencies c_k/t mixed with
  the uniform distribution at weight K·ε, (1 − Kε)·c_k/t + ε (uniform at t = 0), so every symbol
  keeps at least ε (the maximum-likelihood estimate itself gives 0 to unseen symbols: infinite code
  length).
* :func:`blr_predictive` and :func:`coarsened_blr` — conjugate Gaussian Bayesian linear regression
  (w ~ N(0, τ²I), y = w·x + N(0, σ²)); its Gaussian posterior predictive for y_t given the earlier
  (x, y) pairs and x_t, coarsened onto bins (the outer bins open). v3's text names "coarsened BLR
  predictive distributions" without a definition we could read; this is the standard construction
  (METHODS.md §8b says so).

Example
-------
>>> import numpy as np
>>> from bayes_lens.martingale import dirichlet_categorical, dirichlet_log_marginal
>>> x = np.array([[0, 1, 1, 2]])
>>> p = dirichlet_categorical(3, alpha=1.0)(x)
>>> p[0, 3].round(4).tolist()                  # after 0, 1, 1: (c + 1)/(3 + 3)
[0.3333, 0.5, 0.1667]
>>> bool(np.isclose(np.log(p[0, np.arange(4), x[0]]).sum(), dirichlet_log_marginal(x, 3, 1.0)[0]))
True
"""

from __future__ import annotations

from typing import Callable, Tuple

import numpy as np
from scipy.special import gammaln, ndtr

from .._validate import check_float, check_int
from ..errors import InvalidInputError
from ..tasks import dirichlet_predictive
from ._predict import as_symbol_sequences

__all__ = ["dirichlet_categorical", "kt", "plugin_mle", "dirichlet_log_marginal", "blr_predictive",
           "coarsened_blr", "coarsen_gaussian"]


def _counts_before(x: np.ndarray, k: int) -> np.ndarray:
    """``[n, L, K]``: how often each symbol occurred strictly before position t."""
    onehot = np.eye(k, dtype=np.float64)[x]
    c = np.cumsum(onehot, axis=1)
    return np.concatenate([np.zeros_like(c[:, :1]), c[:, :-1]], axis=1)


def dirichlet_categorical(n_symbols: int, alpha: float = 0.5) -> Callable[[np.ndarray], np.ndarray]:
    """The Dirichlet(α·1_K)–categorical posterior predictive: P(x_t = k | x_{<t}) = (c_k + α)/(t − 1 + Kα)."""
    k = check_int(n_symbols, "n_symbols", min=2)
    a = check_float(alpha, "alpha", min=0.0, min_inclusive=False)

    def predictor(sequences) -> np.ndarray:
        x = as_symbol_sequences(sequences, k)  # the counts before each position, through the task's predictive
        return dirichlet_predictive(_counts_before(x, k), alpha=a)

    predictor.__name__ = f"dirichlet_categorical({k}, {a:g})"
    predictor.__qualname__ = predictor.__name__
    predictor.n_symbols = k
    predictor.alpha = a
    return predictor


kt = dirichlet_categorical(2, 0.5)
kt.__doc__ = "Krichevsky–Trofimov over symbols {0, 1}: Dirichlet(½, ½)–categorical, [b, L] -> [b, L, 2]."


def dirichlet_log_marginal(sequences, n_symbols: int, alpha: float = 0.5) -> np.ndarray:
    """log P(x_1 … x_n) (nats) under the Dirichlet(α·1_K)–categorical mixture, per sequence (closed form)."""
    k = check_int(n_symbols, "n_symbols", min=2)
    a = check_float(alpha, "alpha", min=0.0, min_inclusive=False)
    x = as_symbol_sequences(sequences, k)
    c = np.eye(k)[x].sum(1)  # [n, K]
    n = x.shape[1]
    return gammaln(k * a) - gammaln(n + k * a) + (gammaln(c + a) - gammaln(a)).sum(1)


def plugin_mle(n_symbols: int, floor: float = 0.01) -> Callable[[np.ndarray], np.ndarray]:
    """Frequentist plug-in: (1 − Kε)·c_k/(t − 1) + ε, uniform for the empty prefix (ε = ``floor``)."""
    k = check_int(n_symbols, "n_symbols", min=2)
    eps = check_float(floor, "floor", min=0.0, max=1.0 / k, min_inclusive=False)

    def predictor(sequences) -> np.ndarray:
        x = as_symbol_sequences(sequences, k)
        t = np.arange(x.shape[1], dtype=np.float64)[None, :, None]
        freq = np.where(t > 0, _counts_before(x, k) / np.maximum(t, 1.0), 1.0 / k)
        return (1.0 - k * eps) * freq + eps

    predictor.__name__ = f"plugin_mle({k}, floor={eps:g})"
    predictor.__qualname__ = predictor.__name__
    predictor.n_symbols = k
    return predictor


def blr_predictive(X, y, *, prior_var: float = 1.0, noise_var: float = 0.25) -> Tuple[np.ndarray, np.ndarray]:
    """Gaussian posterior predictive of y_t given (x_s, y_s), s < t, and x_t: ``(mean, var)``, each ``[n, L]``.

    Model: w ~ N(0, τ²I_d) (τ² = ``prior_var``), y_s = w·x_s + N(0, σ²) (σ² = ``noise_var``). After t
    pairs the posterior precision is Λ = I/τ² + XᵀX/σ² and mean m = Λ⁻¹Xᵀy/σ²; the predictive is
    N(x_tᵀm, σ² + x_tᵀΛ⁻¹x_t). ``X`` is ``[n, L, d]``, ``y`` ``[n, L]``.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 3 or y.shape != X.shape[:2]:
        raise InvalidInputError(f"X must be [n, L, d] and y [n, L]; got {X.shape} and {y.shape}.")
    tau2 = check_float(prior_var, "prior_var", min=0.0, min_inclusive=False)
    s2 = check_float(noise_var, "noise_var", min=0.0, min_inclusive=False)
    n, L, d = X.shape
    prec = np.broadcast_to(np.eye(d) / tau2, (n, d, d)).copy()
    xy = np.zeros((n, d))
    mean = np.empty((n, L))
    var = np.empty((n, L))
    for t in range(L):
        cov = np.linalg.inv(prec)
        m = np.einsum("nij,nj->ni", cov, xy) / s2
        xt = X[:, t]
        mean[:, t] = np.einsum("ni,ni->n", xt, m)
        var[:, t] = s2 + np.einsum("ni,nij,nj->n", xt, cov, xt)
        prec += np.einsum("ni,nj->nij", xt, xt) / s2
        xy += xt * y[:, t, None]
    return mean, var


def coarsen_gaussian(mean, var, edges) -> np.ndarray:
    """N(mean, var) coarsened onto the bins cut by the sorted inner ``edges`` (B − 1 of them; the two
    outer bins are open): ``[..., B]`` probabilities, Φ((e_{b} − μ)/s) − Φ((e_{b−1} − μ)/s)."""
    e = np.asarray(edges, dtype=np.float64).ravel()
    if e.size < 1 or np.any(np.diff(e) <= 0) or not np.all(np.isfinite(e)):
        raise InvalidInputError("edges must be a non-empty, strictly increasing list of finite inner bin edges.")
    mean = np.asarray(mean, dtype=np.float64)[..., None]
    sd = np.sqrt(np.asarray(var, dtype=np.float64))[..., None]
    cdf = ndtr((e - mean) / sd)
    shape = cdf.shape[:-1] + (1,)
    cdf = np.concatenate([np.zeros(shape), cdf, np.ones(shape)], axis=-1)
    return np.diff(cdf, axis=-1)


def coarsened_blr(X, y, edges, *, prior_var: float = 1.0, noise_var: float = 0.25) -> Tuple[np.ndarray, np.ndarray]:
    """``(probs [n, L, B], bins [n, L])``: the BLR predictive coarsened onto bins, and the bin of each y.

    The reference conditions on the continuous past (x_s, y_s), s < t, as the Bayesian regression does;
    ``bins`` is the symbol sequence a model would see (``np.digitize(y, edges)``).
    """
    mean, var = blr_predictive(X, y, prior_var=prior_var, noise_var=noise_var)
    return coarsen_gaussian(mean, var, edges), np.digitize(np.asarray(y, dtype=np.float64), np.asarray(edges))
