"""Martingale and exchangeability diagnostics and compression efficiency (METHODS.md §8–§9).

Is a language model's in-context predictive on binary sequences Bayesian? A Bayesian predictive is
a martingale and exchangeable; Paper B ("LLMs are Bayesian, In Expectation, Not in Realization",
arXiv 2507.11768) argues that positional encodings break this in realization (a gap of order
log n / n) while keeping it in expectation over orderings; Falck, Wang & Holmes (ICML 2024, arXiv
2406.00793) test it by predictive resampling. This package measures:

* :func:`predictive` — P(next = 1 | prefix) at every prefix, one forward pass per sequence, rendered
  by a :class:`BernoulliTemplate` (default ``"Sequence: 0 1 1 0"``); :func:`predictive_from_logits`
  reads the same from logits a user computed (e.g. with ``run_with_cache``);
* :func:`gap` — Paper B's Δ̂_n (eq. 27) over balanced sequences with weighted fits (IRLS) of
  A·log n/n + B and A/n + B (:func:`fit_gap`, :func:`compare_fits`), next to Laplace's rule;
  :func:`gap_sequences` gives its sequences as a task prompt set (``bl.tasks.export`` writes them);
* :func:`positional_spectrum` — the per-position gap, its FFT, the dominant period refined by a
  least-squares scan of the harmonic fit (:func:`refine_period`), a level-controlled test of its
  multiples 2P, 3P over the per-sequence gaps (:func:`select_period`, :func:`per_position_gap`), a
  harmonic fit;
* :func:`permutation_average` — SD of the predictive averaged over k orderings vs k (slope ≈ −0.5);
* :func:`falck_checks` — T₁, T₂, T₃ by predictive resampling against Beta-posterior bands
  (``definition="library"`` or Falck et al.'s reference definitions, ``"falck"``);
* :func:`compression` — cumulative cross-entropy per symbol vs H(θ), efficiency H(θ)/CE ≤ 1.

Paper B v3 (arXiv 2507.11768v3, METHODS.md §8b) on K-symbol sequences (:class:`CategoricalTemplate`,
:func:`symbol_predictive`: the predictive over K symbol tokens, renormalized, ``[n_seq, L, K]``):

* exact references :func:`dirichlet_categorical` (:data:`kt` for K = 2, α = ½), the plug-in
  :func:`plugin_mle`, conjugate regression :func:`blr_predictive` / :func:`coarsened_blr`;
* :func:`codelength` / :func:`excess_codelength` — excess prequential code length and cumulative
  predictive KL in bits, with the identity between them checked exactly by enumeration;
* :func:`order_averaging` — regret of the given order = regret of the permutation mixture + the
  order-averaging gain; :func:`position_interventions` — moving one symbol, the final prediction's change.

Every function accepts a TransformerLens model *or* a predictor callable (0/1 array [b, L] →
P(x_t = 1 | x_{<t}) [b, L]); :data:`laplace`, :data:`krichevsky_trofimov` and :func:`clipped_mle` are
exact reference predictors, so each diagnostic can be checked against closed forms.

Example
-------
>>> import bayes_lens as bl
>>> res = bl.martingale.gap(bl.martingale.laplace, range(10, 60, 2), n_seqs=20, n_boot=0)
>>> abs(res.laplace_fit_inv.A.value - 1) < 0.2     # Laplace's gap is ≈ 1/n
True
>>> model = bl.load_model()                                             # doctest: +SKIP
>>> bl.martingale.gap(model, range(10, 200, 2)).fits_table()            # doctest: +SKIP
"""

from ._codelength import (CodeLengthResult, OrderAveragingResult, PositionInterventionResult, codelength,
                          exact_identity, excess_codelength, order_averaging, position_interventions)
from ._compression import (CompressionResult, bernoulli_entropy_bits, compression, expected_ce_bits,
                           mixture_codelength_bits)
from ._falck import FalckResult, drop_outlier_paths, falck_checks, falck_statistics, resample_paths
from ._fit import GapFit, compare_fits, fit_gap
from ._gap import GapResult, balanced_sequences, gap, gap_sequences, laplace_expected_gap, martingale_gap
from ._permutation import PermutationResult, permutation_average
from ._predict import (DEFAULT_TEMPLATE, BernoulliTemplate, CategoricalTemplate, beta_bernoulli, clipped_mle,
                       krichevsky_trofimov, laplace, predictive, predictive_from_logits, symbol_predictive)
from ._references import (blr_predictive, coarsen_gaussian, coarsened_blr, dirichlet_categorical,
                          dirichlet_log_marginal, kt, plugin_mle)
from ._spectrum import (SpectrumResult, dominant_periods, harmonic_fit, per_position_gap, positional_spectrum,
                        refine_period, select_period, AutocorrelatedNoiseWarning, residual_autocorrelation)

__all__ = [
    "BernoulliTemplate",
    "DEFAULT_TEMPLATE",
    "predictive",
    "predictive_from_logits",
    "beta_bernoulli",
    "laplace",
    "krichevsky_trofimov",
    "clipped_mle",
    "gap",
    "GapResult",
    "GapFit",
    "fit_gap",
    "compare_fits",
    "balanced_sequences",
    "gap_sequences",
    "martingale_gap",
    "laplace_expected_gap",
    "positional_spectrum",
    "SpectrumResult",
    "dominant_periods",
    "harmonic_fit",
    "refine_period",
    "select_period",
    "AutocorrelatedNoiseWarning",
    "residual_autocorrelation",
    "per_position_gap",
    "permutation_average",
    "PermutationResult",
    "falck_checks",
    "FalckResult",
    "resample_paths",
    "drop_outlier_paths",
    "falck_statistics",
    "compression",
    "CompressionResult",
    "bernoulli_entropy_bits",
    "mixture_codelength_bits",
    "expected_ce_bits",
    "CategoricalTemplate",
    "symbol_predictive",
    "dirichlet_categorical",
    "kt",
    "plugin_mle",
    "dirichlet_log_marginal",
    "blr_predictive",
    "coarsen_gaussian",
    "coarsened_blr",
    "codelength",
    "excess_codelength",
    "exact_identity",
    "CodeLengthResult",
    "order_averaging",
    "OrderAveragingResult",
    "position_interventions",
    "PositionInterventionResult",
]

from .._namespace import package_dir, submodule_getattr  # noqa: E402

__dir__ = package_dir(globals())
__getattr__ = submodule_getattr(globals())
