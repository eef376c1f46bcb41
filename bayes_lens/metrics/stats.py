"""The one statistics kernel every analysis uses: entropies, correlations, bootstrap, permutations.

METHODS.md §0 "Uncertainty": every headline scalar comes with a 95% bootstrap interval over
prompts (resampled jointly, seeded) and, where it has one, a permutation p-value. Each statistic
is written once, here, in a batched form (rows of a ``[B, n]`` array are independent samples, so a
bootstrap or a permutation null is one call), and tested once against scipy:

* :func:`entropy_bits` — H(p) = −Σ p log₂ p over an axis (0·log 0 = 0), from probabilities or logits,
  for torch tensors (float64 inside) and numpy arrays; :func:`chunked_entropy_bits` the same for a
  large torch tensor (attention patterns, logits at every position) a slice at a time, optionally over a
  subset of entries per row (valid keys), so no float64 copy of the whole tensor is made;
* :func:`pearson_rows` / :func:`spearman_rows` — the correlation of matching rows (NaN for a
  numerically constant row); :func:`pearson` / :func:`spearman` for two 1-D samples;
* :func:`slope_rows` — the least-squares slope of y on x, row by row;
* :func:`bootstrap_indices` — the ``[n_boot, n]`` resampling index matrix (one per analysis, so paired
  statistics share resamples);
* :func:`percentile_interval`, :func:`basic_interval` — intervals from bootstrap replicates
  (percentile: [q_α/2, q_1−α/2]; basic: [2θ̂ − q_1−α/2, 2θ̂ − q_α/2]);
* :func:`permutation_pvalue_rows` — two-sided p-value of |r(x, y)| against random permutations of y,
  with the +1 correction (never exactly 0);
* :func:`correlation_inference` — r with its bootstrap interval and permutation p-value, the bootstrap
  and the permutations drawn from *independent* child streams of one seed
  (``np.random.SeedSequence(seed).spawn(2)``);
* :func:`bootstrap_ci` / :func:`permutation_pvalue` — the same for an arbitrary Python statistic;
* :func:`equivalence` — an equivalence test of a change against ±margin read on its 95% interval
  (equivalent / different / inconclusive, with the n that would decide it), the rule behind every
  "survives" verdict; :func:`digits_to_show` prints an interval so it never seems to cross a threshold
  it does not.

Example
-------
>>> import numpy as np
>>> from bayes_lens.metrics import bootstrap_ci, spearman
>>> x = np.arange(20.0); y = x + np.random.default_rng(0).normal(size=20)
>>> round(spearman(x, y), 2) > 0.9
True
>>> lo, hi = bootstrap_ci(spearman, x, y, seed=0)
>>> lo <= spearman(x, y) <= hi
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import numpy as np
import torch
from jaxtyping import Bool, Float, Int

from .._validate import check_choice
from ..errors import InvalidInputError

__all__ = [
    "as_numpy",
    "entropy_bits",
    "chunked_entropy_bits",
    "CHUNK_ELEMENTS",
    "pearson",
    "spearman",
    "pearson_rows",
    "spearman_rows",
    "rank_rows",
    "slope_rows",
    "bootstrap_indices",
    "percentile_interval",
    "basic_interval",
    "permutation_pvalue_rows",
    "CorrelationInference",
    "correlation_inference",
    "bootstrap_ci",
    "permutation_pvalue",
    "child_rngs",
    "Equivalence",
    "about",
    "equivalence",
    "EQUIVALENCE_RULE",
    "EQUIVALENCE_ERROR_AT_MARGIN",
    "digits_to_show",
]

_LN2 = math.log(2.0)
Interval = Tuple[float, float]
_Array = Union[np.ndarray, torch.Tensor]  # what the shape annotations below accept (also nested sequences)


def as_numpy(x: Float[_Array, "*shape"]) -> Float[np.ndarray, "*shape"]:
    """A float64 numpy array from a tensor (also one that requires grad), an array or a sequence."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# entropy
# --------------------------------------------------------------------------------------------


def entropy_bits(p: Float[_Array, "*shape"], axis: int = -1, *, from_logits: bool = False) -> Float[_Array, "*reduced"]:
    """Shannon entropy in bits along ``axis`` (probabilities, or logits with ``from_logits=True``).

    H = −Σ_j p_j log₂ p_j with 0·log 0 = 0. Works on torch tensors (returns a float64 tensor on the
    input's device) and on numpy arrays (returns float64).

    >>> float(entropy_bits(np.array([0.5, 0.5])))
    1.0
    """
    if isinstance(p, torch.Tensor):
        x = p.detach().double()
        if from_logits:
            logp = torch.log_softmax(x, dim=axis)
            return -(logp.exp() * logp).sum(axis) / _LN2
        logp = torch.where(x > 0, torch.log(x.clamp_min(1e-300)), torch.zeros_like(x))
        return -(x * logp).sum(axis) / _LN2
    x = np.asarray(p, dtype=np.float64)
    if from_logits:
        x = x - x.max(axis=axis, keepdims=True)
        logp = x - np.log(np.exp(x).sum(axis=axis, keepdims=True))
        return -(np.exp(logp) * logp).sum(axis) / _LN2
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), 0.0)
    return -(x * logp).sum(axis) / _LN2


#: Most float64 values one slice of :func:`chunked_entropy_bits` holds (2**22 = 32 MiB).
CHUNK_ELEMENTS = 2 ** 22


def chunked_entropy_bits(x: Float[torch.Tensor, "*batch k"], *, dim: int,
                         keys: Optional[Bool[torch.Tensor, "*batch k"]] = None, from_logits: bool = False,
                         max_elements: Optional[int] = None) -> Float[torch.Tensor, "*batch"]:
    """:func:`entropy_bits` over the last axis of a torch tensor, ``max_elements`` float64 values at a time
    (default :data:`CHUNK_ELEMENTS`).

    ``x`` is cut into slices along ``dim`` (not the last axis); each slice is cast to float64, reduced
    and freed, so the peak extra memory is one slice, not a float64 copy of ``x`` (a bf16 attention
    pattern ``[batch, head, q, k]`` at 8k tokens is gigabytes in float64). ``keys`` (boolean,
    broadcastable to ``x``; probabilities only) keeps only those entries of each row and renormalizes
    over them. Returns float64 on ``x``'s device with the last axis removed.

    >>> p = torch.full((2, 3, 4), 0.25)
    >>> chunked_entropy_bits(p, dim=1, max_elements=8).tolist()
    [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """
    dim = dim % x.ndim
    if dim == x.ndim - 1:
        raise InvalidInputError("chunked_entropy_bits slices along an axis other than the last (the reduced one); "
                                f"got dim={dim} for a tensor of {x.ndim} dimensions.")
    per_slice = max(1, x.numel() // max(1, x.shape[dim]))
    step = max(1, int(CHUNK_ELEMENTS if max_elements is None else max_elements) // per_slice)
    if keys is not None:
        keys = keys.to(x.device)
        while keys.ndim < x.ndim:
            keys = keys.unsqueeze(0)
    out = []
    for s0 in range(0, x.shape[dim], step):
        part = x.narrow(dim, s0, min(step, x.shape[dim] - s0)).double()
        if keys is not None:
            k = keys.narrow(dim, s0, part.shape[dim]) if keys.shape[dim] == x.shape[dim] else keys
            part = torch.where(k, part, torch.zeros((), dtype=part.dtype, device=part.device))
            part = part / part.sum(-1, keepdim=True).clamp_min(1e-300)
        out.append(entropy_bits(part, from_logits=from_logits))
        del part
    return torch.cat(out, dim=dim)


# --------------------------------------------------------------------------------------------
# correlations, slopes
# --------------------------------------------------------------------------------------------


def rank_rows(x: Float[np.ndarray, "*rows n"]) -> Float[np.ndarray, "*rows n"]:
    """Average ranks along the last axis (ties share their mean rank), as scipy's ``rankdata``."""
    from scipy.stats import rankdata

    return rankdata(x, axis=-1)


def pearson_rows(x: Float[_Array, "*rows n"], y: Float[_Array, "*rows n"]) -> Float[np.ndarray, "*rows"]:
    """Pearson correlation of matching rows of ``x`` and ``y`` (``[..., n]``, broadcast).

    NaN where a row is (numerically) constant: the centred norm must exceed 1e-12 of the raw norm,
    so a row of equal floats that differ only by rounding is constant, not a correlation of noise.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    xc = x - x.mean(-1, keepdims=True)
    yc = y - y.mean(-1, keepdims=True)
    num = (xc * yc).sum(-1)
    den = np.sqrt((xc * xc).sum(-1) * (yc * yc).sum(-1))
    scale = np.sqrt((x * x).sum(-1) * (y * y).sum(-1)) + 1e-300
    ok = den > 1e-12 * scale
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, num / np.where(ok, den, 1.0), np.nan)


def spearman_rows(x: Float[_Array, "*rows n"], y: Float[_Array, "*rows n"]) -> Float[np.ndarray, "*rows"]:
    """Spearman rank correlation of matching rows (average ranks for ties; NaN for a constant row)."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    return pearson_rows(rank_rows(x), rank_rows(y))


def _pair(x, y) -> Tuple[np.ndarray, np.ndarray]:
    x, y = as_numpy(x).ravel(), as_numpy(y).ravel()
    if x.shape != y.shape:
        raise InvalidInputError(f"x and y must have the same length, got {x.size} and {y.size}.")
    return x, y


def pearson(x: Float[_Array, "n"], y: Float[_Array, "n"]) -> float:
    """Pearson correlation of two 1-D samples (NaN if either is constant)."""
    x, y = _pair(x, y)
    return float(pearson_rows(x, y))


def spearman(x: Float[_Array, "n"], y: Float[_Array, "n"]) -> float:
    """Spearman rank correlation of two 1-D samples (average ranks for ties; NaN if either is constant)."""
    x, y = _pair(x, y)
    return float(spearman_rows(x, y))


def slope_rows(x: Float[_Array, "*rows n"], y: Float[_Array, "*rows n"]) -> Float[np.ndarray, "*rows"]:
    """Least-squares slope of y on x for matching rows (NaN where x is constant)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    xc = x - x.mean(-1, keepdims=True)
    den = (xc * xc).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, (xc * (y - y.mean(-1, keepdims=True))).sum(-1) / np.where(den > 0, den, 1.0),
                        np.nan)


# --------------------------------------------------------------------------------------------
# bootstrap and permutation
# --------------------------------------------------------------------------------------------


def _rng(seed_or_rng) -> np.random.Generator:
    if isinstance(seed_or_rng, np.random.Generator):
        return seed_or_rng
    return np.random.default_rng(seed_or_rng)


def child_rngs(n: int, *, seed) -> Tuple[np.random.Generator, ...]:
    """``n`` independent generators spawned from one seed (``np.random.SeedSequence(seed).spawn(n)``).

    Use one per random purpose (bootstrap, permutations, data) so that changing the number of draws
    of one never changes the others, and no two share a stream.
    """
    return tuple(np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n))


def _key_int(value, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or int(value) < 0:
        raise InvalidInputError(f"keyed_rng / keyed_seed take non-negative integers; the {what} is {value!r}.")
    return int(value)


def _keyed_sequence(seed, keys) -> np.random.SeedSequence:
    """The SeedSequence of ``(seed, *keys)``: distinct tuples give distinct hash inputs (no padding collisions).

    ``SeedSequence([seed, *keys])`` alone is not injective: each integer becomes its 32-bit words and
    the words are zero-padded to the pool size (4), so ``(5,) ≡ (5, 0)``, ``(5, 1) ≡ (5 + 2**32,)`` and
    ``(5, 1000, 0) ≡ (5, 1000)``. Tuples of three or more values below 2**32 - the form of every call
    site in the library (``keyed_seed(seed, 1000, i)``, ``keyed_rng(seed, 7, i, N)``) - keep that
    input (so their streams are the ones of earlier versions) except a four-value tuple ending in 0,
    the one padded form that collides inside that family. Every other tuple is length-prefixed (the
    value count, then each value as its word count and words, so no two tuples give the same words)
    and hashed with a pool of 8 words, a separate function from the pool-4 one.
    """
    values = [_key_int(seed, "seed"), *(_key_int(k, f"key {i}") for i, k in enumerate(keys))]
    if len(values) >= 3 and all(v < 2 ** 32 for v in values) and not (len(values) == 4 and values[-1] == 0):
        return np.random.SeedSequence(values)
    words = [len(values)]
    for v in values:
        w = []
        while True:
            w.append(v & 0xFFFFFFFF)
            v >>= 32
            if not v:
                break
        words += [len(w), *w]
    return np.random.SeedSequence(words, pool_size=8)


def keyed_rng(seed, *keys: int) -> np.random.Generator:
    """A generator for one random purpose inside an analysis, keyed by ``(seed, *keys)``.

    Distinct tuples of non-negative integers give independent streams (unlike ``seed + k`` offsets,
    which collide: ``seed + 7·i + N`` repeats across settings, and unlike a bare
    ``SeedSequence([seed, *keys])``, whose zero padding makes ``(5,)`` and ``(5, 0)`` one stream; see
    :func:`_keyed_sequence`), and a result does not depend on loop order.
    """
    return np.random.default_rng(_keyed_sequence(seed, keys))


def keyed_seed(seed, *keys: int) -> int:
    """An integer seed for a callee that takes one, derived like :func:`keyed_rng` (63 bits)."""
    return int(_keyed_sequence(seed, keys).generate_state(2, np.uint64)[0] >> 1)


def bootstrap_indices(n: int, n_boot: int, *, seed=0, strata=None) -> Int[np.ndarray, "n_boot n"]:
    """``[n_boot, n]`` row indices drawn with replacement: one bootstrap resample per row (``seed``: an
    int or a ``numpy.random.Generator``).

    ``strata`` (length n, e.g. the number of examples k of each SULA prompt): a stratified bootstrap,
    each row redrawn from the rows of its own stratum, so every resample keeps each stratum's count.
    Use it when the design fixes those counts: resampling across strata adds the spread of the counts
    (a variance the data do not have) and over-covers (SULA MAE: 0.97–0.995 for a nominal 0.95).
    Position j of a resample holds a row of the same stratum as row j. One stratum (or None) gives
    the plain draw, the same numbers for the same seed.
    """
    rng = _rng(seed)
    if strata is None:
        return rng.integers(0, n, size=(n_boot, n))
    strata = np.asarray(strata).ravel()
    if strata.size != n:
        raise InvalidInputError(f"strata must have one label per row ({n}), got {strata.size}.")
    values, labels = np.unique(strata, return_inverse=True)
    if values.size <= 1:
        return rng.integers(0, n, size=(n_boot, n))
    out = np.empty((n_boot, n), dtype=np.int64)
    for s in range(values.size):  # strata in sorted order: the draw does not depend on row order
        rows = np.flatnonzero(labels == s)
        out[:, rows] = rows[rng.integers(0, rows.size, size=(n_boot, rows.size))]
    return out


def percentile_interval(reps: Float[_Array, "n_boot *rest"], level: float = 0.95, *, min_finite: float = 0.5,
                        axis: Optional[int] = None):
    """Percentile interval [q_α/2, q_1−α/2] of bootstrap replicates, NaN replicates dropped.

    (NaN, NaN) when fewer than ``min_finite`` of the replicates are finite. With ``axis`` (the axis of
    the replicates), one interval per remaining entry: ``(low_array, high_array)``.
    """
    if axis is not None:
        r = np.moveaxis(np.asarray(reps, dtype=np.float64), axis, 0)
        fin = np.isfinite(r)
        a = (1 - level) / 2
        ok = (fin.sum(0) > 0) & (fin.sum(0) >= min_finite * r.shape[0])
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                lo, hi = np.nanquantile(np.where(fin, r, np.nan), [a, 1 - a], axis=0)
        return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)
    reps = np.asarray(reps, dtype=np.float64).ravel()
    fin = reps[np.isfinite(reps)]
    if fin.size == 0 or fin.size < min_finite * reps.size:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.quantile(fin, [a, 1 - a])
    return float(lo), float(hi)


def basic_interval(estimate: float, reps: Float[_Array, "n_boot"], level: float = 0.95, *,
                   min_finite: float = 0.5) -> Interval:
    """Basic (reverse-percentile) bootstrap interval [2θ̂ − q_1−α/2, 2θ̂ − q_α/2]."""
    lo, hi = percentile_interval(reps, level, min_finite=min_finite)
    return 2 * estimate - hi, 2 * estimate - lo


def permutation_pvalue_rows(x: Float[_Array, "n"], y: Float[_Array, "n"], observed: float, *, n_perm: int = 1000, seed=0,
                            rank: bool = False) -> float:
    """Two-sided permutation p-value of a correlation: (#{|r(x, π y)| ≥ |r|} + 1) / (n_perm + 1).

    ``rank=True`` for Spearman (ranks commute with permutations, so they are taken once).
    NaN when ``observed`` is NaN or there are fewer than 3 samples.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if not np.isfinite(observed) or x.size < 3:
        return float("nan")
    if rank:
        x, y = rank_rows(x), rank_rows(y)
    rng = _rng(seed)
    perms = np.argsort(rng.random((n_perm, y.size)), axis=1)
    null = pearson_rows(np.broadcast_to(x, perms.shape), y[perms])
    null = np.where(np.isfinite(null), np.abs(null), 0.0)
    return float((np.sum(null >= abs(observed) - 1e-12) + 1) / (n_perm + 1))


@dataclass(frozen=True, eq=False)
class CorrelationInference:
    """A correlation with its 95% percentile bootstrap interval and permutation p-value."""

    value: float
    ci: Interval
    pvalue: float
    method: str  # "pearson" | "spearman"


def correlation_inference(x: Float[_Array, "n"], y: Float[_Array, "n"], *, method: str = "spearman", n_boot: int = 1000, n_perm: int = 1000,
                          seed: int = 0, level: float = 0.95) -> CorrelationInference:
    """r(x, y) (Pearson or Spearman), its percentile bootstrap interval over the pairs, and a
    two-sided permutation p-value; bootstrap and permutations use independent child streams of
    ``seed`` (:func:`child_rngs`)."""
    check_choice(method, "method", ("pearson", "spearman"))
    x, y = _pair(x, y)
    corr = spearman_rows if method == "spearman" else pearson_rows
    r = float(corr(x, y))
    boot_rng, perm_rng = child_rngs(2, seed=seed)
    idx = bootstrap_indices(x.size, n_boot, seed=boot_rng)
    ci = percentile_interval(corr(x[idx], y[idx]), level)
    p = permutation_pvalue_rows(x, y, r, n_perm=n_perm, seed=perm_rng, rank=method == "spearman")
    return CorrelationInference(value=r, ci=ci, pvalue=p, method=method)


def bootstrap_ci(stat: Callable[..., float], *arrays, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> Interval:
    """Percentile bootstrap interval of ``stat(*arrays)``, resampling rows of all arrays jointly.

    For a Python statistic (one call per resample); the analyses use the batched row forms above.
    NaN replicates are dropped; if more than half are NaN the interval is (NaN, NaN).
    """
    if not arrays:
        raise InvalidInputError("bootstrap_ci needs at least one array.")
    if not 0 < level < 1:
        raise InvalidInputError(f"level must be in (0, 1), got {level}.")
    arrs = [a if isinstance(a, np.ndarray) else as_numpy(a) for a in arrays]
    n = len(arrs[0])
    if any(len(a) != n for a in arrs):
        raise InvalidInputError("all arrays passed to bootstrap_ci must have the same number of rows.")
    if n < 2:
        return float("nan"), float("nan")
    idx = bootstrap_indices(n, n_boot, seed=seed)
    reps = np.array([stat(*[a[i] for a in arrs]) for i in idx], dtype=np.float64)
    return percentile_interval(reps, level)


def permutation_pvalue(x: Float[_Array, "n"], y: Float[_Array, "n"], stat: Callable[[np.ndarray, np.ndarray], float] = spearman, *,
                       n_perm: int = 1000, seed: Union[int, np.random.Generator] = 0) -> float:
    """Two-sided permutation p-value of an arbitrary ``stat(x, y)``: P(|stat(x, π y)| ≥ |stat(x, y)|)."""
    x, y = _pair(x, y)
    observed = abs(stat(x, y))
    if not np.isfinite(observed):
        return float("nan")
    rng = _rng(seed)
    count = sum(abs(stat(x, y[np.argsort(rng.random(y.size))])) >= observed - 1e-12 for _ in range(n_perm))
    return float((count + 1) / (n_perm + 1))



def digits_to_show(values, thresholds, *, digits: int = 2, max_digits: int = 8) -> int:
    """The fewest decimals (≥ ``digits``) at which every value in ``values`` is shown on the same side
    of every threshold in ``thresholds`` as it really is, so a printed interval never seems to contain
    a threshold it excludes ([-0.5604, -0.5004] printed as [-0.56, -0.50] seems to contain −0.5; at
    four decimals it does not).

    >>> digits_to_show([-0.5604, -0.5004], [-0.5])
    4
    """
    for d in range(digits, max_digits + 1):
        ok = True
        for v in values:
            for t in thresholds:
                if not (math.isfinite(v) and math.isfinite(t)) or v == t:
                    continue
                shown = round(v, d)
                if (shown > t) != (v > t) or shown == t:
                    ok = False
        if ok:
            return d
    return max_digits


#: How often "equivalent" is wrong when the true change sits exactly on the margin, with the flagship's
#: intervals (stratified percentile bootstrap over 60 prompts, 12 per k): measured 3.4% in simulation
#: (tests/metrics/test_stats.py::test_equivalence_error_at_the_margin_with_bootstrap_intervals), not the
#: nominal 2.5%: a percentile bootstrap's interval is narrower than an exact one, by √((n − s)/n) with s
#: strata and a normal quantile for Student's t on n − s degrees of freedom (P(T₅₅ > 1.96·√(55/60)) = 3.3%).
EQUIVALENCE_ERROR_AT_MARGIN = 0.034

EQUIVALENCE_RULE = ("equivalence test on the 95% interval of the change (two one-sided tests at a nominal 2.5% "
                    "each): equivalent when the whole interval lies inside ±margin, different when it lies wholly "
                    "outside, inconclusive otherwise; with bootstrap intervals over 60 prompts a true change "
                    f"exactly at the margin is called equivalent {EQUIVALENCE_ERROR_AT_MARGIN:.1%} of the time "
                    "(measured), not 2.5%")


@dataclass(frozen=True)
class Equivalence:
    """The outcome of an equivalence test of a change ``value`` (with its 95% interval ``ci``) against
    a margin ``±margin`` (METHODS.md §7, "Calibration survives"):

    * ``"equivalent"`` when lo > −margin and hi < +margin (the whole interval inside the margin: a
      change as large as the margin is excluded at the 95% level, i.e. two one-sided tests at a nominal
      2.5%; with the flagship's stratified percentile-bootstrap intervals over 60 prompts the measured
      rate at the margin is 3.4%, :data:`EQUIVALENCE_ERROR_AT_MARGIN`: the bootstrap interval is a little
      narrower than an exact one);
    * ``"different"`` when lo > +margin or hi < −margin (the whole interval outside: the change
      exceeds the margin);
    * ``"inconclusive"`` otherwise (or when the interval could not be computed).

    ``n_to_decide`` is the number of units (prompts) at which the test would decide if the point
    estimate stayed where it is and the interval shrank as 1/√n: n·(w/g)², with w the distance from the
    estimate to the interval's end that crosses the margin and g the distance from the estimate to
    the margin on that side (None when decided, when ``n`` is unknown, or when the estimate sits on
    the margin).

    >>> t = equivalence(0.002, (-0.001, 0.006), margin=0.005, n=60)
    >>> t.outcome, t.n_to_decide
    ('inconclusive', 107)
    >>> equivalence(0.002, (0.001, 0.003), margin=0.005).outcome
    'equivalent'
    """

    outcome: str
    value: float
    ci: Interval
    margin: float
    n: Optional[int] = None
    n_to_decide: Optional[int] = None

    @property
    def decided(self) -> bool:
        return self.outcome != "inconclusive"

    def describe(self, what: str, *, unit: str = "", scale: float = 1.0, pct: bool = False) -> str:
        """One sentence with the rule and the numbers, e.g. ``"Δ SULA MAE = +0.0005 bits
        [−0.0010, +0.0021], wholly inside the equivalence margin ±0.0030 bits: equivalent"``.

        ``scale`` divides every number first (the clean value, to print a relative change); ``pct``
        prints it as a percentage.
        """
        lo, hi = self.ci
        nums = [self.value / scale, lo / scale, hi / scale]
        m = self.margin / scale
        k = 100.0 if pct else 1.0
        d = digits_to_show([x * k for x in nums], [m * k, -m * k, 0.0], digits=1 if pct else 4)  # and 0's side
        suffix = "%" if pct else (f" {unit}" if unit else "")

        def f(x, sign=True):
            return f"{x * k:{'+' if sign else ''}.{d}f}".replace("-", "−") + ("%" if pct else "")

        where = {"equivalent": "wholly inside", "different": "wholly outside",
                 "inconclusive": "overlapping"}[self.outcome]
        if not (math.isfinite(lo) and math.isfinite(hi)):
            where = "no interval for"
        text = (f"{what} = {f(nums[0])}{'' if pct else suffix} [{f(nums[1])}, {f(nums[2])}], {where} the "
                f"equivalence margin ±{f(m, sign=False)}{'' if pct else suffix}: {self.outcome}")
        if self.outcome == "inconclusive" and self.n_to_decide is not None:
            # a rough extrapolation: two significant figures ("about n = 1,100"), the exact value in n_to_decide
            text += f" (would decide at about n = {about(self.n_to_decide)} if the estimate held, vs n = {self.n} here)"
        return text


def about(n: int, digits: int = 2) -> str:
    """A count rounded to ``digits`` significant figures (halves up), with thousands separated: how a
    rough figure is written in words (``about(1069) == "1,100"``, ``about(83) == "83"``).

    >>> about(1069), about(2998), about(955), about(83)
    ('1,100', '3,000', '960', '83')
    """
    n = int(n)
    k = 10 ** max(len(str(abs(n))) - int(digits), 0)
    return f"{int(math.floor(abs(n) / k + 0.5)) * k * (1 if n >= 0 else -1):,}"


def equivalence(value: float, ci: Interval, margin: float, *, n: Optional[int] = None) -> Equivalence:
    """Equivalence test of a change against ``±margin`` read on its 95% interval (see :class:`Equivalence`)."""
    margin = float(margin)
    if not (math.isfinite(margin) and margin > 0):
        raise InvalidInputError(f"margin must be a positive finite number, got {margin!r}.")
    value, lo, hi = float(value), float(ci[0]), float(ci[1])
    if not all(math.isfinite(x) for x in (value, lo, hi)):
        return Equivalence("inconclusive", value, (lo, hi), margin, n, None)
    if -margin < lo and hi < margin:
        return Equivalence("equivalent", value, (lo, hi), margin, n, None)
    if lo > margin or hi < -margin:
        return Equivalence("different", value, (lo, hi), margin, n, None)
    if abs(value) < margin:          # would become equivalent: the end beyond the margin must come in
        w, g = (hi - value, margin - value) if value >= 0 else (value - lo, margin + value)
    else:                            # would become different: the end towards 0 must clear the margin
        w, g = (value - lo, value - margin) if value > 0 else (hi - value, -margin - value)
    need = int(math.ceil(n * (w / g) ** 2)) if n and g > 0 and w > 0 else None
    return Equivalence("inconclusive", value, (lo, hi), margin, n, need)
