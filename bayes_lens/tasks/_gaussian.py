"""A Gaussian in-context task with a conjugate prior: numbers in context, the next number's first digit.

METHODS.md §6c, after "The Shape of Beliefs" (Sarfati et al., arXiv 2602.02315), whose data are
comma-delimited numbers drawn from a Gaussian (``"457,387,567,"``, one JSONL record per sequence with
``sequence_id`` and ``sequence_content``). Here each prompt is such a sequence: x₁ … x_k ~ N(μ, σ²)
printed with ``decimals`` decimals, delimiter after each (``"4.3,5.1,3.9,"``). Two conjugate priors:

* ``prior="normal"`` (σ known): μ ~ N(μ₀, τ₀²); the posterior predictive of x_{k+1} is
  N(m_k, s_k² + σ²) with 1/s_k² = 1/τ₀² + k/σ², m_k = s_k² (μ₀/τ₀² + Σx/σ²);
* ``prior="nig"`` (Normal–Inverse-Gamma, σ unknown): σ² ~ IG(a₀, b₀), μ | σ² ~ N(μ₀, σ²/κ₀); the
  predictive is Student-t with 2a_k degrees of freedom, location m_k and scale² b_k(κ_k + 1)/(a_k κ_k)
  (κ_k = κ₀ + k, m_k = (κ₀μ₀ + Σx)/κ_k, a_k = a₀ + k/2, b_k = b₀ + ½Σ(x − x̄)² + κ₀k(x̄ − μ₀)²/(2κ_k)).

The answers are the ten digits ``"0"`` … ``"9"`` (no leading space: the prompt ends in the delimiter,
as in the paper's format): the model's next token is the *first character* of the next number. The
exact posterior over the answers is the predictive mass of the numbers whose printed form starts with
each digit, renormalized over the digits (a printed number that starts with ``"-"`` is not an
answer): with h = ½·10^(−decimals) (printing rounds), digit 0 ↔ x ∈ [0, 1 − h) and digit j ≥ 1 ↔
⋃_{m≥0} [j·10^m − h, (j + 1)·10^m − h) (so ``"1"`` also covers 10–19.x, 100–199.x, …); the digits
together cover [0, ∞). The predictive CDF is integrated over these bins exactly (normal / Student-t
CDFs). The conditioning data are the *printed* values (what the model sees); the rounding to
``decimals`` decimals is not modelled (its variance, 10^(−2·decimals)/12, is below 0.1% of σ² at the
defaults). The outcome is the first digit of x_{k+1} drawn from the same μ, σ; while it prints negative
the *whole item* (μ, σ, x₁ … x_{k+1}) is redrawn, so that, given the shown values, the outcome follows
the renormalized predictive the item states (redrawing only x_{k+1} with μ kept would not: its law
would be E_{μ | values}[P(j | μ) / P(x ≥ 0 | μ)], up to 0.065 in total variation at the defaults).

Example
-------
>>> from bayes_lens.models.tiny import tiny_tokenizer
>>> items = gaussian_prompts(tiny_tokenizer(), ks=(1, 4), n_per_k=2, seed=0)
>>> items.answers[:3], items[0].text
(('0', '1', '2'), '5.1,')
>>> p = leading_digit_probs(gaussian_predictive([5.0], prior="normal", mu0=5.0, tau0=2.0, sigma=1.0), decimals=1)
>>> round(float(p.sum()), 12), int(p.argmax())
(1.0, 5)
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from scipy import stats

from .._validate import check_choice, check_count, check_float, check_int, check_seed
from ..errors import InvalidInputError
from ._categorical import check_ks
from ._protocol import TaskItem, TaskPrompts, answer_token_ids, get_tokenizer

__all__ = ["gaussian_prompts", "gaussian_predictive", "leading_digit_probs", "GAUSSIAN_VERSION", "PRIORS"]

#: Bumped whenever the same arguments would generate different items.
GAUSSIAN_VERSION = "gaussian-2"
#: The conjugate priors :func:`gaussian_prompts` offers.
PRIORS = ("normal", "nig")
_DIGITS = tuple(str(d) for d in range(10))
_MAX_REDRAWS = 10_000


def gaussian_predictive(values, *, prior: str = "normal", mu0: float = 5.0, tau0: float = 2.0, sigma: float = 1.0,
                        kappa0: float = 1.0, a0: float = 3.0, b0: float = 2.0):
    """The exact posterior predictive of the next value given ``values`` (a ``scipy.stats`` frozen
    normal for ``prior="normal"``, Student-t for ``"nig"``; see the module docstring for the formulas)."""
    prior = check_choice(prior, "prior", PRIORS)
    x = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise InvalidInputError("values must be finite numbers.")
    k = x.size
    mu0 = check_float(mu0, "mu0")
    if prior == "normal":
        tau0 = check_float(tau0, "tau0", min=0.0, min_inclusive=False)
        sigma = check_float(sigma, "sigma", min=0.0, min_inclusive=False)
        prec = 1.0 / tau0 ** 2 + k / sigma ** 2
        mean = (mu0 / tau0 ** 2 + x.sum() / sigma ** 2) / prec
        return stats.norm(loc=mean, scale=np.sqrt(1.0 / prec + sigma ** 2))
    kappa0 = check_float(kappa0, "kappa0", min=0.0, min_inclusive=False)
    a0 = check_float(a0, "a0", min=0.0, min_inclusive=False)
    b0 = check_float(b0, "b0", min=0.0, min_inclusive=False)
    kn, an = kappa0 + k, a0 + k / 2.0
    xbar = x.mean() if k else 0.0
    mn = (kappa0 * mu0 + x.sum()) / kn
    bn = b0 + 0.5 * ((x - xbar) ** 2).sum() + (kappa0 * k * (xbar - mu0) ** 2 / (2.0 * kn) if k else 0.0)
    return stats.t(df=2.0 * an, loc=mn, scale=np.sqrt(bn * (kn + 1.0) / (an * kn)))


def _mass(dist, lo, hi):
    """P(lo ≤ X < hi) elementwise, each from the tail that keeps precision."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    return np.where(hi <= dist.median(), dist.cdf(hi) - dist.cdf(lo), dist.sf(lo) - dist.sf(hi))


#: decades summed for the leading digits 1-9: [j·10^m − h, (j + 1)·10^m − h) for m < 300 (10^300 stays finite;
#: a conjugate predictive with at least 6 degrees of freedom has no mass in double precision beyond it)
_DECADES = 10.0 ** np.arange(300)


def leading_digit_probs(dist, *, decimals: int = 1) -> np.ndarray:
    """P(the next number, printed with ``decimals`` decimals, starts with digit j | it starts with a digit),
    j = 0 … 9, for a ``scipy.stats`` frozen distribution ``dist``."""
    decimals = check_int(decimals, "decimals", min=0)
    h = 0.5 * 10.0 ** (-decimals)
    j = np.arange(1, 10, dtype=np.float64)[:, None]
    out = np.zeros(10)
    out[0] = float(_mass(dist, 0.0, 1.0 - h))
    out[1:] = _mass(dist, j * _DECADES - h, (j + 1) * _DECADES - h).sum(1)
    if not float(dist.sf(0.0)) > 0.0:
        raise InvalidInputError("the predictive puts no mass on non-negative numbers; choose mu0 well above 0.")
    return out / out.sum()


def _fmt(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


def gaussian_prompts(model, *, prior: str = "normal", mu0: float = 5.0, tau0: float = 2.0, sigma: float = 1.0,
                     kappa0: float = 1.0, a0: float = 3.0, b0: float = 2.0, decimals: int = 1,
                     ks: Sequence[int] = (1, 2, 4, 8, 16), n_per_k: int = 40, seed: int = 0,
                     delimiter: str = ",") -> TaskPrompts:
    """Prompts of the Gaussian task with the exact posterior over the next number's first digit (METHODS.md §6c).

    Parameters
    ----------
    model:
        A TransformerLens model or a tokenizer (each digit ``"0"`` … ``"9"`` must be one token).
    prior:
        ``"normal"`` (σ known, μ ~ N(mu0, tau0²)) or ``"nig"`` (σ² ~ IG(a0, b0), μ | σ² ~ N(mu0, σ²/kappa0)).
    decimals, delimiter:
        Printed precision of each number, and what follows each (the paper: integers and ``","``).
    ks, n_per_k:
        Numbers of values shown (each ≥ 1), and prompts per k.
    seed:
        Seeds every draw (μ, σ, the values, the next value), in that order per try; a prompt whose next
        value prints negative is redrawn whole.
    """
    seed = check_seed(seed)
    tok = get_tokenizer(model)
    prior = check_choice(prior, "prior", PRIORS)
    spec = dict(prior=prior, mu0=check_float(mu0, "mu0"), tau0=check_float(tau0, "tau0", min=0.0, min_inclusive=False),
                sigma=check_float(sigma, "sigma", min=0.0, min_inclusive=False),
                kappa0=check_float(kappa0, "kappa0", min=0.0, min_inclusive=False),
                a0=check_float(a0, "a0", min=0.0, min_inclusive=False),
                b0=check_float(b0, "b0", min=0.0, min_inclusive=False))
    decimals = int(check_int(decimals, "decimals", min=0, max=6))
    ks = check_ks(ks)
    if min(ks) < 1:
        raise InvalidInputError(f"every k must be ≥ 1 (a prompt with no numbers is empty), got ks={ks}.")
    n_per_k = check_count(n_per_k, "n_per_k")
    if not isinstance(delimiter, str) or not delimiter or any(c.isdigit() or c in "-." for c in delimiter):
        raise InvalidInputError(f"delimiter must be a non-empty string without digits, '-' or '.', got {delimiter!r}.")
    answers = _DIGITS
    answer_token_ids(tok, answers)
    rng = np.random.default_rng(seed)
    prior_post = tuple(float(p) for p in leading_digit_probs(gaussian_predictive([], **spec), decimals=decimals))
    items = []
    for k in ks:
        for _ in range(n_per_k):
            # the whole item (μ, σ, the values, the next value) is redrawn while the next value prints
            # negative: keeping μ and redrawing only x_{k+1} would give P(outcome | values) =
            # E_{μ | values}[P(j | μ) / P(x ≥ 0 | μ)], not the renormalized predictive the item states.
            for _ in range(_MAX_REDRAWS):
                if prior == "normal":
                    sd = spec["sigma"]
                    mu = rng.normal(spec["mu0"], spec["tau0"])
                else:
                    sd = float(np.sqrt(spec["b0"] / rng.gamma(spec["a0"], 1.0)))
                    mu = rng.normal(spec["mu0"], sd / np.sqrt(spec["kappa0"]))
                shown = [_fmt(x, decimals) for x in rng.normal(mu, sd, size=k)]
                nxt = _fmt(rng.normal(mu, sd), decimals)
                if nxt[0].isdigit():
                    break
            else:  # pragma: no cover - needs a prior far below 0
                raise InvalidInputError("the next number printed negative 10,000 times; choose mu0 well above 0.")
            values = [float(s) for s in shown]
            post = leading_digit_probs(gaussian_predictive(values, **spec), decimals=decimals)
            text = delimiter.join(shown) + delimiter
            items.append(TaskItem(text, task="gaussian", answers=answers, posterior=tuple(float(p) for p in post), k=k,
                                  outcome=int(nxt[0]), prior_posterior=prior_post, values=values, mu=float(mu),
                                  sigma=float(sd), next_value=float(nxt), sequence_id=f"seq_{len(items):03d}",
                                  sequence_content=text))
    params = {**spec, "decimals": decimals, "ks": list(ks), "n_per_k": n_per_k, "delimiter": delimiter}
    definition = (f"x_i ~ N(mu, sigma^2) printed with {decimals} decimals; prior {prior!r} (conjugate); posterior[j] = "
                  "P(next printed number starts with digit j | printed values, it starts with a digit), the "
                  "normal (known sigma) or Student-t (NIG) posterior predictive integrated over the leading-digit "
                  "bins; outcome = first digit of x_{k+1} (the whole item redrawn while it is negative).")
    return TaskPrompts(items, task="gaussian", seed=seed, generator_version=GAUSSIAN_VERSION, params=params,
                       posterior_definition=definition)
