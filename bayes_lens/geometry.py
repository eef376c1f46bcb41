"""Bayesian geometry of a language model: value manifold, key orthogonality, focusing, alignment.

Paper A ("Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752) §4.2 and §5.1,
specified in METHODS.md §0–§4:

* **Value manifold** (§1): final-real-token ``hook_v`` vectors at one layer, all key/value heads
  concatenated (one n_kv·d_head sample per prompt), z-scored per coordinate, PCA by SVD in
  float64. Reports the explained-variance ratio of PC1 and PC1+PC2 with 95% percentile bootstrap
  intervals over prompts, the participation ratio (Σλ)²/Σλ², per-prompt PC coordinates, and a
  simulated null: the same statistics for standardized i.i.d. Gaussian data of the same n × d.
  Resamples with duplicated prompts inflate PC1 when n < d, so by default the bootstrap interval is
  recentred on the estimate (``ci_method="recentered"``; ``"percentile"`` gives the plain one).
  ``site="resid_post"`` is the paper script's variant (final-layer residual states).
* **Key orthogonality** (§2): per layer and KV head, the mean off-diagonal |cos| of the
  ℓ2-normalized d_head columns of W_K ∈ R^{d_model×d_head} (raw weights), next to the exact
  dimension-matched Gaussian E|cos| = Γ(d/2)/(√π Γ((d+1)/2)) with d = d_model, a simulated
  distribution for the same W_K shape, the paper's √(2/(π d_head)) (labelled as its convention),
  and optionally the same metric on a ``reference`` model (e.g. an untrained copy).
* **Attention focusing** (§3): per layer and head, the entropy (bits) of the final query row of
  ``hook_pattern`` over the valid keys, computed inside the hook; per head first, then averaged
  over heads, then over prompts (bootstrap CIs). Reduction (H_first − H_last)/H_first (paper pass
  threshold > 30%), monotonicity (Spearman of depth vs entropy; number of layers where entropy
  rises); ``positions="all"`` averages over every real query row (Paper A §4.5).
* **Entropy alignment** (§4): Spearman (and Pearson) correlation of the per-prompt PC1 coordinate
  with the model's full-vocabulary next-token entropy in bits, with bootstrap CI and permutation
  p-value; the sign of a PC is arbitrary, so ρ and |ρ| are both reported.

Every metric takes a model and prompts (a streaming, batched, mask-aware run: only final-token
rows and per-head entropies are kept), a user's ``ActivationCache`` (made with
``names_filter=bl.hook_filter()``; pass ``attention_mask`` for padded batches) or a
:class:`bayes_lens.collect.Collection`.

Example
-------
>>> import bayes_lens as bl                                   # doctest: +SKIP
>>> model = bl.load_model()                                   # doctest: +SKIP
>>> geo = bl.geometry(model, prompts)                         # doctest: +SKIP
>>> geo.value_manifold.pc12, geo.value_manifold.null_pc12     # doctest: +SKIP
>>> logits, cache = model.run_with_cache(tokens, names_filter=bl.hook_filter())  # doctest: +SKIP
>>> bl.value_manifold(cache).pc1                              # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np
import torch

from . import adapter
from ._results import Result, plotly
from .collect import Collection, collect
from .errors import BayesLensError, InvalidInputError, MissingHookError
from .hooks import _check_finite, final_rows, last_index, pattern_entropy_bits
from .metrics.keys import (
    gaussian_abs_cosine, mean_abs_offdiag_cosine, paper_abs_cosine_baseline, simulate_gaussian_abs_cosine,
)
from .metrics.pca import bootstrap_pca_stats, gaussian_null_pca_stats, pca
from .metrics.stats import as_numpy

__all__ = [
    "ValueManifold",
    "KeyOrthogonality",
    "AttentionFocusing",
    "EntropyAlignment",
    "Geometry",
    "value_manifold",
    "key_orthogonality",
    "attention_focusing",
    "entropy_alignment",
    "geometry",
]

_SITES = {"v": "v", "hook_v": "v", "resid_post": "resid_post"}
CI = Tuple[float, float]


def _quantile_ci(samples: np.ndarray, level: float = 0.95) -> CI:
    s = samples[np.isfinite(samples)]
    if s.size == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.quantile(s, [a, 1 - a])
    return float(lo), float(hi)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueManifold(Result):
    """Standardized PCA of final-token value (or residual) vectors across prompts (METHODS.md §1)."""

    layer: int
    site: str
    hook_name: str
    n_prompts: int
    dim: int
    n_constant_dims: int
    pc1: float
    pc12: float
    pc1_ci: CI
    pc12_ci: CI
    participation_ratio: float
    participation_ratio_ci: CI
    explained_variance_ratio: np.ndarray  # leading components
    null_pc1: float  # mean over simulations of standardized i.i.d. Gaussian n × d data
    null_pc12: float
    null_participation_ratio: float
    null_pc1_interval: CI  # 2.5% / 97.5% quantiles of the simulated null
    null_pc12_interval: CI
    null_participation_ratio_interval: CI
    coords: torch.Tensor  # [n_prompts, n_components]
    bootstrap_bias: Tuple[float, float, float] = (0.0, 0.0, 0.0)  # median(boot) − estimate: PC1, PC1+2, PR
    ci_method: str = "recentered"
    expand_kv: bool = False
    n_boot: int = 1000
    n_null: int = 200
    seed: int = 0

    def to_dataframe(self):
        """One row per statistic: value, bootstrap CI and the simulated Gaussian null."""
        import pandas as pd

        rows = []
        for stat, val, ci, null, nint in (
            ("pc1_explained_variance_fraction", self.pc1, self.pc1_ci, self.null_pc1, self.null_pc1_interval),
            ("pc12_explained_variance_fraction", self.pc12, self.pc12_ci, self.null_pc12, self.null_pc12_interval),
            ("participation_ratio_dims", self.participation_ratio, self.participation_ratio_ci,
             self.null_participation_ratio, self.null_participation_ratio_interval),
        ):
            rows.append(dict(metric="value_manifold", layer=self.layer, site=self.site, statistic=stat, value=val,
                             ci_low=ci[0], ci_high=ci[1], null_mean=null, null_low=nint[0], null_high=nint[1],
                             n_prompts=self.n_prompts, dim=self.dim))
        return pd.DataFrame(rows)

    def plot(self):
        """Explained-variance ratio of the leading components against the Gaussian null's PC1."""
        go = plotly()
        k = len(self.explained_variance_ratio)
        fig = go.Figure()
        fig.add_bar(x=[f"PC{i + 1}" for i in range(k)], y=list(self.explained_variance_ratio), name="model")
        fig.add_hline(y=self.null_pc1, line_dash="dash", annotation_text="Gaussian null PC1")
        fig.update_layout(title=f"Value manifold, layer {self.layer} ({self.site}); PC1+PC2 = {self.pc12:.1%}",
                          yaxis_title="explained variance fraction")
        return fig


@dataclass(frozen=True)
class KeyOrthogonality(Result):
    """Mean off-diagonal |cos| of W_K columns per layer and KV head, with baselines (METHODS.md §2)."""

    per_head: torch.Tensor  # [n_layers, n_kv_heads]
    layer_mean: torch.Tensor  # [n_layers]
    layer_percentiles: torch.Tensor  # [n_layers, 3]: 10/50/90 % across the layer's heads
    percentiles: Tuple[float, float, float]  # 10/50/90 % across every head of every layer
    d_model: int
    d_head: int
    gaussian_baseline: float  # exact E|cos| for independent Gaussian vectors in R^{d_model}
    gaussian_simulated_mean: float  # simulated statistic for i.i.d. Gaussian W_K of the same shape
    gaussian_simulated_interval: CI
    paper_baseline: float  # √(2/(π d_head)): the paper's convention
    reference_per_head: Optional[torch.Tensor] = None
    reference_layer_mean: Optional[torch.Tensor] = None
    processed: bool = False
    processing: str = "raw weights"
    paper_threshold: float = 0.20

    @property
    def ratio_to_gaussian(self) -> torch.Tensor:
        return self.layer_mean / self.gaussian_baseline

    @property
    def ratio_to_paper(self) -> torch.Tensor:
        return self.layer_mean / self.paper_baseline

    @property
    def ratio_to_reference(self) -> Optional[torch.Tensor]:
        return None if self.reference_layer_mean is None else self.layer_mean / self.reference_layer_mean

    @property
    def fraction_layers_below_threshold(self) -> float:
        """Fraction of layers with mean |cos| < 0.20 (Paper A passes at ≥ 50%)."""
        return float((self.layer_mean < self.paper_threshold).double().mean())

    def to_dataframe(self):
        """Long format: one row per (layer, KV head) with the baselines and ratios."""
        import pandas as pd

        rows = []
        for layer in range(self.per_head.shape[0]):
            for head in range(self.per_head.shape[1]):
                val = float(self.per_head[layer, head])
                ref = None if self.reference_per_head is None else float(self.reference_per_head[layer, head])
                rows.append(dict(metric="key_orthogonality", layer=layer, kv_head=head, mean_abs_cosine=val,
                                 gaussian_baseline=self.gaussian_baseline,
                                 gaussian_simulated_mean=self.gaussian_simulated_mean,
                                 paper_baseline_dhead=self.paper_baseline, reference_mean_abs_cosine=ref,
                                 ratio_to_gaussian=val / self.gaussian_baseline,
                                 ratio_to_paper=val / self.paper_baseline,
                                 ratio_to_reference=None if ref is None else val / ref))
        return pd.DataFrame(rows)

    def plot(self):
        go = plotly()
        x = list(range(len(self.layer_mean)))
        fig = go.Figure()
        fig.add_scatter(x=x, y=self.layer_mean.tolist(), mode="lines+markers", name="layer mean |cos|")
        if self.reference_layer_mean is not None:
            fig.add_scatter(x=x, y=self.reference_layer_mean.tolist(), mode="lines", name="reference model")
        fig.add_hline(y=self.gaussian_baseline, line_dash="dash", annotation_text="Gaussian (d_model)")
        fig.add_hline(y=self.paper_baseline, line_dash="dot", annotation_text="paper √(2/(π d_head))")
        fig.update_layout(title="Key orthogonality", xaxis_title="layer", yaxis_title="mean |cos| of W_K columns")
        return fig


@dataclass(frozen=True)
class AttentionFocusing(Result):
    """Attention entropy (bits) per layer and head over prompts (METHODS.md §3)."""

    layer_entropy_bits: torch.Tensor  # [n_layers]: mean over prompts of the per-prompt head mean
    layer_entropy_ci: torch.Tensor  # [n_layers, 2]
    head_entropy_bits: torch.Tensor  # [n_layers, n_heads]
    reduction: float  # (H_first − H_last) / H_first
    reduction_ci: CI
    depth_spearman: float  # Spearman(layer index, layer entropy): negative = focusing with depth
    depth_spearman_ci: CI
    n_rises: int  # layers whose entropy exceeds the previous layer's
    uniform_entropy_bits: float  # the same row entropy under uniform attention (a no-focusing null)
    positions: str = "last"
    n_prompts: int = 0
    paper_threshold: float = 0.30

    @property
    def monotone(self) -> bool:
        return self.n_rises == 0

    def to_dataframe(self):
        """One row per (layer, head) plus one per layer (head = 'mean') with CIs."""
        import pandas as pd

        rows = []
        for layer in range(self.head_entropy_bits.shape[0]):
            rows.append(dict(metric="attention_focusing", layer=layer, head="mean",
                             entropy_bits=float(self.layer_entropy_bits[layer]),
                             ci_low=float(self.layer_entropy_ci[layer, 0]),
                             ci_high=float(self.layer_entropy_ci[layer, 1]), positions=self.positions))
            for head in range(self.head_entropy_bits.shape[1]):
                rows.append(dict(metric="attention_focusing", layer=layer, head=str(head),
                                 entropy_bits=float(self.head_entropy_bits[layer, head]),
                                 ci_low=None, ci_high=None, positions=self.positions))
        return pd.DataFrame(rows)

    def plot(self):
        go = plotly()
        x = list(range(len(self.layer_entropy_bits)))
        fig = go.Figure()
        fig.add_scatter(x=x, y=self.layer_entropy_ci[:, 1].tolist(), mode="lines", line_width=0, showlegend=False)
        fig.add_scatter(x=x, y=self.layer_entropy_ci[:, 0].tolist(), mode="lines", line_width=0, fill="tonexty",
                        name="95% CI")
        fig.add_scatter(x=x, y=self.layer_entropy_bits.tolist(), mode="lines+markers", name="mean over heads")
        fig.add_hline(y=self.uniform_entropy_bits, line_dash="dash", annotation_text="uniform attention")
        fig.update_layout(title=f"Attention focusing: reduction {self.reduction:.1%}", xaxis_title="layer",
                          yaxis_title="attention entropy (bits)")
        return fig


@dataclass(frozen=True)
class EntropyAlignment(Result):
    """Correlation of the per-prompt PC1 coordinate with next-token entropy (METHODS.md §4)."""

    spearman: float
    spearman_ci: CI
    spearman_pvalue: float
    pearson: float
    pearson_ci: CI
    pearson_pvalue: float
    layer: int
    site: str
    n_prompts: int
    pc1_coords: torch.Tensor  # [n]
    entropy_bits: torch.Tensor  # [n] next-token entropy (full vocabulary)

    @property
    def abs_spearman(self) -> float:
        return abs(self.spearman)

    @property
    def abs_pearson(self) -> float:
        return abs(self.pearson)

    def to_dataframe(self):
        import pandas as pd

        rows = [dict(metric="entropy_alignment", layer=self.layer, site=self.site, statistic=name, value=v,
                     abs_value=abs(v), ci_low=ci[0], ci_high=ci[1], permutation_pvalue=p, n_prompts=self.n_prompts)
                for name, v, ci, p in (("spearman_rho", self.spearman, self.spearman_ci, self.spearman_pvalue),
                                       ("pearson_r", self.pearson, self.pearson_ci, self.pearson_pvalue))]
        return pd.DataFrame(rows)

    def plot(self):
        go = plotly()
        fig = go.Figure()
        fig.add_scatter(x=self.pc1_coords.tolist(), y=self.entropy_bits.tolist(), mode="markers")
        fig.update_layout(title=f"PC1 vs next-token entropy: Spearman ρ = {self.spearman:+.2f}",
                          xaxis_title=f"PC1 coordinate (layer {self.layer}, {self.site})",
                          yaxis_title="next-token entropy (bits)")
        return fig


@dataclass(frozen=True)
class Geometry(Result):
    """All four geometry measurements of one model on one prompt set."""

    value_manifold: ValueManifold
    key_orthogonality: KeyOrthogonality
    attention_focusing: AttentionFocusing
    entropy_alignment: EntropyAlignment

    def to_dataframe(self):
        """The four long tables stacked (column ``metric`` says which)."""
        import pandas as pd

        return pd.concat([self.value_manifold.to_dataframe(), self.key_orthogonality.to_dataframe(),
                          self.attention_focusing.to_dataframe(), self.entropy_alignment.to_dataframe()],
                         ignore_index=True, sort=False)

    def plot(self):
        """A 2 × 2 figure: value-manifold spectrum, key orthogonality, focusing curve, alignment."""
        plotly()
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=2, cols=2, subplot_titles=("value manifold", "key orthogonality",
                                                            "attention focusing", "entropy alignment"))
        for (r, c), part in zip(((1, 1), (1, 2), (2, 1), (2, 2)),
                                (self.value_manifold, self.key_orthogonality, self.attention_focusing,
                                 self.entropy_alignment)):
            for trace in part.plot().data:
                fig.add_trace(trace, row=r, col=c)
        fig.update_layout(showlegend=False, title="Bayesian geometry")
        return fig


# --------------------------------------------------------------------------------------------
# Sources: model + prompts, ActivationCache, or Collection
# --------------------------------------------------------------------------------------------


def _site(site: str) -> str:
    if site not in _SITES:
        raise InvalidInputError(f"site must be 'v' (hook_v, the default) or 'resid_post', got {site!r}.")
    return _SITES[site]


def _kind(obj, prompts) -> str:
    if isinstance(obj, Collection):
        return "collection"
    if adapter.is_activation_cache(obj):
        if prompts is not None:
            raise InvalidInputError("pass either a model with prompts, or an ActivationCache without prompts.")
        return "cache"
    if prompts is None:
        raise InvalidInputError("prompts are required with a model (or pass an ActivationCache).")
    return "model"


def _need_prompts(prompts, minimum: int = 3) -> None:
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a list of strings, not one string.")
    n = len(list(prompts))
    if n == 0:
        raise InvalidInputError("the prompt list is empty; pass at least 3 prompts.")
    if n < minimum:
        raise InvalidInputError(f"PCA across prompts needs at least {minimum} prompts, got {n}; pass more prompts.")


def _cache_tensor(cache, name: str):
    if not adapter.cache_has(cache, name):
        raise MissingHookError(
            f"the ActivationCache has no {name!r}; make it with "
            f"model.run_with_cache(tokens, names_filter=bl.hook_filter()) (add sites=('resid_post',) for "
            "site='resid_post')."
        )
    return cache[name]


def _cache_mask(cache, attention_mask):
    if attention_mask is None:
        return None
    return torch.as_tensor(attention_mask)


def _samples(obj, prompts, *, layer, site, attention_mask, batch_size, padding_side, progress):
    """(samples [n, d] float64 numpy, layer, hook name, model)."""
    s = _site(site)
    if isinstance(obj, Collection):
        store = obj.final_values if s == "v" else obj.final_resid
        if not store:
            raise MissingHookError(f"the Collection holds no {'values' if s == 'v' else 'resid_post'} rows.")
        if layer < 0:
            keys = sorted(store)
            if layer == -1 and len(keys) == 1:
                layer = keys[0]
            else:
                raise InvalidInputError("with a Collection pass a non-negative layer index it holds: "
                                        f"{sorted(store)}.")
        if layer not in store:
            raise MissingHookError(f"the Collection holds layers {sorted(store)}, not {layer}.")
        return as_numpy(store[layer]), layer, adapter.SITES[s].format(layer=layer), None
    kind = _kind(obj, prompts)
    if kind == "cache":
        model = adapter.cache_model(obj)
        layer = adapter.resolve_layer(model, layer)
        name = adapter.hook_name(model, layer, s)
        x = final_rows(_cache_tensor(obj, name), _cache_mask(obj, attention_mask), what=name)
        return as_numpy(x), layer, name, model
    model = obj
    _need_prompts(prompts)
    layer = adapter.resolve_layer(model, layer)
    col = collect(model, prompts, value_layers=[layer] if s == "v" else (), resid_layers=[layer] if s != "v" else (),
                  batch_size=batch_size, padding_side=padding_side, progress=progress)
    store = col.final_values if s == "v" else col.final_resid
    return as_numpy(store[layer]), layer, adapter.hook_name(model, layer, s), model


def _expand(x: np.ndarray, model, expand_kv: bool) -> np.ndarray:
    if not expand_kv:
        return x
    if model is None:
        raise InvalidInputError("expand_kv=True needs the model (or a cache that records it).")
    info = adapter.model_info(model)
    rep = info.n_heads // info.n_kv_heads
    return np.repeat(x.reshape(x.shape[0], info.n_kv_heads, info.d_head), rep, axis=1).reshape(x.shape[0], -1)


# --------------------------------------------------------------------------------------------
# Public metrics
# --------------------------------------------------------------------------------------------


_CI_METHODS = ("recentered", "percentile")


def _pca_cis(boot: np.ndarray, estimates, ci_method: str):
    """CIs of (PC1, PC1+PC2, PR) from bootstrap replicates, and the bootstrap bias (median − estimate).

    Resampling prompts with replacement duplicates rows; with n < d that lowers the rank of the
    standardized matrix and inflates PC1 / lowers PR in every replicate, so the plain percentile
    interval can miss the estimate entirely. ``"recentered"`` (default) keeps the percentile
    interval's shape and width but centres it on the estimate: [θ̂ + q_lo − med, θ̂ + q_hi − med].
    ``"percentile"`` is the plain percentile interval.
    """
    cis, bias = [], []
    for j, est in enumerate(estimates):
        col = boot[:, j][np.isfinite(boot[:, j])]
        lo, hi = _quantile_ci(col)
        med = float(np.median(col)) if col.size else float("nan")
        bias.append(med - est)
        cis.append((lo, hi) if ci_method == "percentile" else (est + lo - med, est + hi - med))
    return cis, tuple(bias)


def _value_manifold_from(x: np.ndarray, *, layer, site, name, seed, n_boot, n_null, n_components,
                         expand_kv, ci_method="recentered") -> ValueManifold:
    if ci_method not in _CI_METHODS:
        raise InvalidInputError(f"ci_method must be one of {_CI_METHODS}, got {ci_method!r}.")
    fit = pca(x, n_components=n_components)
    evr = fit.explained_variance_ratio
    pc1, pc12, pr = float(evr[0]), float(evr[:2].sum()), fit.participation_ratio
    boot = bootstrap_pca_stats(x, n_boot=n_boot, seed=seed)
    (pc1_ci, pc12_ci, pr_ci), bias = _pca_cis(boot, (pc1, pc12, pr), ci_method)
    null = gaussian_null_pca_stats(x.shape[0], int(fit.kept.sum()), n_sims=n_null, seed=seed + 1)
    return ValueManifold(
        layer=layer, site=site, hook_name=name, n_prompts=x.shape[0], dim=x.shape[1], n_constant_dims=fit.n_constant,
        pc1=pc1, pc12=pc12, pc1_ci=pc1_ci, pc12_ci=pc12_ci,
        participation_ratio=pr, participation_ratio_ci=pr_ci, bootstrap_bias=bias, ci_method=ci_method,
        explained_variance_ratio=evr[: min(len(evr), 20)].copy(),
        null_pc1=float(null[:, 0].mean()), null_pc12=float(null[:, 1].mean()),
        null_participation_ratio=float(null[:, 2].mean()),
        null_pc1_interval=_quantile_ci(null[:, 0]), null_pc12_interval=_quantile_ci(null[:, 1]),
        null_participation_ratio_interval=_quantile_ci(null[:, 2]),
        coords=torch.from_numpy(fit.coords.copy()), expand_kv=expand_kv, n_boot=n_boot, n_null=n_null, seed=seed,
    )


def value_manifold(model_or_cache, prompts=None, *, layer: int = -1, site: str = "v", attention_mask=None,
                   seed: int = 0, n_boot: int = 1000, n_null: int = 200, n_components: int = 10,
                   expand_kv: bool = False, ci_method: str = "recentered", batch_size: int = 16,
                   padding_side: str = "right", progress: Optional[bool] = True) -> ValueManifold:
    """Standardized PCA of final-token value vectors across prompts (Paper A §4.2; METHODS.md §1).

    ``model_or_cache`` is a model (then ``prompts`` is a list of ≥ 3 strings), an ActivationCache
    (made with ``names_filter=bl.hook_filter()``; pass its ``attention_mask`` when padded) or a
    :class:`~bayes_lens.collect.Collection`. ``site="resid_post"`` uses residual states (the paper
    script's variant). ``expand_kv=True`` repeats KV heads to the query-head layout (off: repeated
    copies inflate PCA). ``n_null`` Gaussian simulations at the same n × d give the null.
    ``ci_method``: ``"recentered"`` (default) or ``"percentile"``; see :func:`_pca_cis` — resamples
    with duplicated prompts inflate PC1, so the plain percentile interval is biased upwards.
    """
    if ci_method not in _CI_METHODS:
        raise InvalidInputError(f"ci_method must be one of {_CI_METHODS}, got {ci_method!r}.")
    x, layer, name, model = _samples(model_or_cache, prompts, layer=layer, site=site, attention_mask=attention_mask,
                                     batch_size=batch_size, padding_side=padding_side, progress=progress)
    if expand_kv and _site(site) != "v":
        raise InvalidInputError("expand_kv applies to site='v' only.")
    x = _expand(x, model, expand_kv)
    return _value_manifold_from(x, layer=layer, site=_site(site), name=name, seed=seed, n_boot=n_boot,
                                n_null=n_null, n_components=n_components, expand_kv=expand_kv, ci_method=ci_method)


def _key_stats(model, info) -> np.ndarray:
    """[n_layers, n_kv_heads] mean off-diagonal |cos| (float64), one layer at a time to keep memory flat."""
    rows = []
    for layer in range(info.n_layers):
        try:
            rows.append(mean_abs_offdiag_cosine(adapter.key_weights(model, layer, info=info).numpy().astype(np.float64)))
        except BayesLensError as exc:
            raise type(exc)(f"layer {layer}: {exc}") from None
    return np.stack(rows)


def key_orthogonality(model, *, reference=None, n_sims: int = 200, seed: int = 0,
                      on_processed: str = "warn") -> KeyOrthogonality:
    """Mean off-diagonal |cos| of W_K columns per layer and KV head, with baselines (METHODS.md §2).

    ``reference``: another model of the same shape (an untrained copy, a step-0 checkpoint) whose
    values are reported as the "initialization" baseline. ``on_processed``: ``"warn"`` (default),
    ``"error"`` or ``"ignore"`` when the weights were processed (folded layer norm changes W_K).
    """
    if on_processed not in ("warn", "error", "ignore"):
        raise InvalidInputError(f"on_processed must be 'warn', 'error' or 'ignore', got {on_processed!r}.")
    if adapter.is_activation_cache(model) or isinstance(model, Collection):
        raise InvalidInputError("key orthogonality is a weight metric: pass the model, not a cache.")
    info = adapter.model_info(model)
    rinfo = None if reference is None else adapter.model_info(reference)
    for m, label in ((info, "model"), (rinfo, "reference")):
        if m is None:
            continue
        done, how = m.processed, m.processing
        if done and on_processed != "ignore":
            msg = (f"the {label}'s weights were processed ({how}); W_K columns then differ from the trained "
                   "weights. Load it without processing (bl.load_model / from_pretrained_no_processing).")
            if on_processed == "error":
                raise InvalidInputError(msg)
            warnings.warn(msg, UserWarning, stacklevel=2)
    per_head = _key_stats(model, info)
    ref = None
    if reference is not None:
        if (rinfo.n_layers, rinfo.n_kv_heads, rinfo.d_model, rinfo.d_head) != (
                info.n_layers, info.n_kv_heads, info.d_model, info.d_head):
            raise InvalidInputError(
                "the reference model's shape (layers, KV heads, d_model, d_head) "
                f"{(rinfo.n_layers, rinfo.n_kv_heads, rinfo.d_model, rinfo.d_head)} differs from the model's "
                f"{(info.n_layers, info.n_kv_heads, info.d_model, info.d_head)}.")
        ref = _key_stats(reference, rinfo)
    sims = simulate_gaussian_abs_cosine(info.d_model, info.d_head, n_sims=n_sims, seed=seed)
    t = torch.from_numpy
    return KeyOrthogonality(
        per_head=t(per_head), layer_mean=t(per_head.mean(axis=1)),
        layer_percentiles=t(np.percentile(per_head, [10, 50, 90], axis=1).T.copy()),
        percentiles=tuple(float(q) for q in np.percentile(per_head, [10, 50, 90])),
        d_model=info.d_model, d_head=info.d_head,
        gaussian_baseline=gaussian_abs_cosine(info.d_model),
        gaussian_simulated_mean=float(sims.mean()), gaussian_simulated_interval=_quantile_ci(sims),
        paper_baseline=paper_abs_cosine_baseline(info.d_head),
        reference_per_head=None if ref is None else t(ref),
        reference_layer_mean=None if ref is None else t(ref.mean(axis=1)),
        processed=info.processed, processing=info.processing,
    )


def _depth_spearman_rows(curves: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    depth = np.arange(curves.shape[1], dtype=np.float64)
    r = rankdata(curves, axis=1)
    d = depth - depth.mean()
    rc = r - r.mean(axis=1, keepdims=True)
    den = np.sqrt((rc ** 2).sum(axis=1) * (d ** 2).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rc @ d) / den


def _focusing_from(ent: np.ndarray, *, uniform: float, positions: str, seed: int, n_boot: int) -> AttentionFocusing:
    """``ent`` [n, n_layers, n_heads] per-prompt per-head entropies (bits)."""
    n = ent.shape[0]
    if n < 1:
        raise InvalidInputError("attention focusing needs at least one prompt.")
    per_prompt = ent.mean(axis=2)  # per head first, then the head mean: [n, L]
    curve = per_prompt.mean(axis=0)

    def reduction(c):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (c[..., 0] - c[..., -1]) / c[..., 0]

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    boot = per_prompt[idx].mean(axis=1)  # [B, L]
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0) if n > 1 else (np.full_like(curve, np.nan),) * 2
    nan_ci = (float("nan"), float("nan"))
    return AttentionFocusing(
        layer_entropy_bits=torch.from_numpy(curve.copy()),
        layer_entropy_ci=torch.from_numpy(np.stack([lo, hi], axis=1)),
        head_entropy_bits=torch.from_numpy(ent.mean(axis=0)),
        reduction=float(reduction(curve)), reduction_ci=_quantile_ci(reduction(boot)) if n > 1 else nan_ci,
        depth_spearman=float(_depth_spearman_rows(curve[None])[0]),
        depth_spearman_ci=_quantile_ci(_depth_spearman_rows(boot)) if n > 1 else nan_ci,
        n_rises=int((np.diff(curve) > 0).sum()), uniform_entropy_bits=uniform, positions=positions, n_prompts=n,
    )


def _uniform_entropy(n_tokens: np.ndarray, positions: str) -> float:
    n_tokens = np.asarray(n_tokens, dtype=np.float64)
    if positions == "last":
        return float(np.log2(n_tokens).mean())
    return float(np.mean([np.log2(np.arange(1, int(t) + 1)).mean() for t in n_tokens]))


def attention_focusing(model_or_cache, prompts=None, *, positions: str = "last", attention_mask=None,
                       seed: int = 0, n_boot: int = 1000, batch_size: int = 16, padding_side: str = "right",
                       progress: Optional[bool] = True) -> AttentionFocusing:
    """Per-layer, per-head attention entropy of the final query row over valid keys (METHODS.md §3).

    ``positions="all"`` averages over every real query row (Paper A §4.5). From a cache, every
    layer's ``hook_pattern`` must be present (``names_filter=bl.hook_filter()``).
    """
    if positions not in ("last", "all"):
        raise InvalidInputError(f"positions must be 'last' or 'all', got {positions!r}.")
    if isinstance(model_or_cache, Collection):
        col = model_or_cache
        if col.attn_entropy_bits is None:
            raise MissingHookError("the Collection was made without attention=True.")
        if col.attention_positions != positions:
            raise InvalidInputError(f"the Collection holds positions={col.attention_positions!r} entropies.")
        ent, n_tok = as_numpy(col.attn_entropy_bits), col.n_tokens.numpy()
    elif _kind(model_or_cache, prompts) == "cache":
        cache = model_or_cache
        model = adapter.cache_model(cache)
        mask = _cache_mask(cache, attention_mask)
        pats = []
        for layer in range(int(model.cfg.n_layers)):
            name = adapter.hook_name(model, layer, "pattern")
            pats.append(pattern_entropy_bits(_cache_tensor(cache, name), mask, positions=positions, what=name))
        ent = torch.stack(pats, dim=1).numpy()
        first = _cache_tensor(cache, adapter.hook_name(model, 0, "pattern"))
        n_tok = (mask.sum(1) if mask is not None else torch.full((first.shape[0],), first.shape[-1])).numpy()
    else:
        col = collect(model_or_cache, prompts, attention=True, attention_positions=positions, batch_size=batch_size,
                      padding_side=padding_side, progress=progress)
        ent, n_tok = as_numpy(col.attn_entropy_bits), col.n_tokens.numpy()
    return _focusing_from(ent, uniform=_uniform_entropy(n_tok, positions), positions=positions, seed=seed,
                          n_boot=n_boot)


def _row_corr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of matching rows of [B, n] arrays (NaN for a constant row)."""
    a = a - a.mean(axis=-1, keepdims=True)
    b = b - b.mean(axis=-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def _corr_inference(x: np.ndarray, y: np.ndarray, *, rank: bool, n_boot: int, n_perm: int, seed: int):
    """(r, bootstrap CI, permutation p) — vectorized; the same resamples and permutations (same seed,
    same random streams) as :func:`~bayes_lens.metrics.stats.bootstrap_ci` and
    :func:`~bayes_lens.metrics.stats.permutation_pvalue`, so the numbers are identical to theirs."""
    from scipy.stats import rankdata

    def prep(a):
        return rankdata(a, axis=-1) if rank else a

    n = x.shape[0]
    r = float(_row_corr(prep(x)[None], prep(y)[None])[0])
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    reps = _row_corr(prep(x[idx]), prep(y[idx]))
    reps = reps[np.isfinite(reps)]
    ci = (float("nan"), float("nan")) if reps.size < n_boot / 2 else tuple(
        float(q) for q in np.quantile(reps, [0.025, 0.975]))
    if not np.isfinite(r):
        return r, ci, float("nan")
    rng = np.random.default_rng(seed)
    perms = np.stack([rng.permutation(n) for _ in range(n_perm)])
    px, py = prep(x), prep(y)  # ranks commute with permutations
    null = np.abs(_row_corr(np.broadcast_to(px, (n_perm, n)), py[perms]))
    p = float((np.sum(null >= abs(r) - 1e-12) + 1) / (n_perm + 1))
    return r, ci, p


def _alignment_from(coords: np.ndarray, ent: np.ndarray, *, layer, site, seed, n_boot, n_perm) -> EntropyAlignment:
    if coords.shape[0] < 3:
        raise InvalidInputError(f"entropy alignment needs at least 3 prompts, got {coords.shape[0]}.")
    coords, ent = as_numpy(coords).ravel(), as_numpy(ent).ravel()
    rho, rho_ci, rho_p = _corr_inference(coords, ent, rank=True, n_boot=n_boot, n_perm=n_perm, seed=seed)
    r, r_ci, r_p = _corr_inference(coords, ent, rank=False, n_boot=n_boot, n_perm=n_perm, seed=seed)
    return EntropyAlignment(
        spearman=rho, spearman_ci=rho_ci, spearman_pvalue=rho_p, pearson=r, pearson_ci=r_ci, pearson_pvalue=r_p,
        layer=layer, site=site, n_prompts=coords.shape[0],
        pc1_coords=torch.from_numpy(coords.copy()), entropy_bits=torch.from_numpy(ent.copy()),
    )


def _next_token_entropy_from_logits(logits, attention_mask) -> np.ndarray:
    logits = torch.as_tensor(logits)
    if logits.ndim != 3:
        raise InvalidInputError(f"logits must be [batch, pos, vocab], got shape {list(logits.shape)}.")
    mask = torch.ones(logits.shape[:2], dtype=torch.long) if attention_mask is None else torch.as_tensor(attention_mask)
    if mask.shape != logits.shape[:2]:
        raise InvalidInputError(f"attention_mask {list(mask.shape)} does not match logits {list(logits.shape[:2])}.")
    idx = last_index(mask).to(logits.device)
    fl = logits[torch.arange(logits.shape[0], device=logits.device), idx]
    _check_finite(fl, "the final-token logits", None)
    logp = torch.log_softmax(fl.double(), -1)
    return (-(logp.exp() * logp).sum(-1) / np.log(2.0)).cpu().numpy()


def entropy_alignment(model_or_cache, prompts=None, *, layer: int = -1, site: str = "v", attention_mask=None,
                      logits=None, seed: int = 0, n_boot: int = 1000, n_perm: int = 1000,
                      batch_size: int = 16, padding_side: str = "right",
                      progress: Optional[bool] = True) -> EntropyAlignment:
    """Spearman/Pearson of the per-prompt PC1 coordinate with next-token entropy (METHODS.md §4).

    PC1 is that of the standardized PCA of :func:`value_manifold` at ``layer``/``site``. From an
    ActivationCache pass the ``logits`` returned with it (and ``attention_mask`` when padded).
    """
    s = _site(site)
    if isinstance(model_or_cache, Collection):
        x, layer, _, _ = _samples(model_or_cache, None, layer=layer, site=s, attention_mask=None,
                                  batch_size=batch_size, padding_side=padding_side, progress=progress)
        ent = as_numpy(model_or_cache.next_token_entropy_bits)
    elif _kind(model_or_cache, prompts) == "cache":
        if logits is None:
            raise InvalidInputError("from an ActivationCache pass logits= (what run_with_cache returned) to get "
                                    "the next-token entropy.")
        x, layer, _, _ = _samples(model_or_cache, None, layer=layer, site=s, attention_mask=attention_mask,
                                  batch_size=batch_size, padding_side=padding_side, progress=progress)
        ent = _next_token_entropy_from_logits(logits, _cache_mask(model_or_cache, attention_mask))
    else:
        model = model_or_cache
        _need_prompts(prompts)
        layer = adapter.resolve_layer(model, layer)
        col = collect(model, prompts, value_layers=[layer] if s == "v" else (),
                      resid_layers=[layer] if s != "v" else (), batch_size=batch_size, padding_side=padding_side,
                      progress=progress)
        return entropy_alignment(col, layer=layer, site=s, seed=seed, n_boot=n_boot, n_perm=n_perm)
    if x.shape[0] != ent.shape[0]:
        raise InvalidInputError(f"{x.shape[0]} activation rows but {ent.shape[0]} logit rows.")
    coords = pca(x, n_components=1).coords[:, 0]
    return _alignment_from(coords, ent, layer=layer, site=s, seed=seed, n_boot=n_boot, n_perm=n_perm)


def geometry(model, prompts, *, layer: int = -1, site: str = "v", positions: str = "last", reference=None,
             seed: int = 0, n_boot: int = 1000, n_null: int = 200, n_perm: int = 1000, expand_kv: bool = False,
             ci_method: str = "recentered", batch_size: int = 16, padding_side: str = "right", on_processed: str = "warn",
             progress: Optional[bool] = True) -> Geometry:
    """Value manifold, key orthogonality, attention focusing and entropy alignment in one pass.

    One batched forward pass over ``prompts`` keeps only the final-token rows at ``layer`` and the
    per-head attention entropies; the statistics follow METHODS.md §1–§4 (see the module docstring).
    """
    s = _site(site)
    if adapter.is_activation_cache(model) or isinstance(model, Collection):
        raise InvalidInputError("geometry() needs the model (key orthogonality reads its weights); use the "
                                "individual metrics with a cache.")
    if positions not in ("last", "all"):
        raise InvalidInputError(f"positions must be 'last' or 'all', got {positions!r}.")
    if ci_method not in _CI_METHODS:
        raise InvalidInputError(f"ci_method must be one of {_CI_METHODS}, got {ci_method!r}.")
    _need_prompts(prompts)
    layer = adapter.resolve_layer(model, layer)
    keys = key_orthogonality(model, reference=reference, seed=seed, on_processed=on_processed)
    col = collect(model, prompts, value_layers=[layer] if s == "v" else (), resid_layers=[layer] if s != "v" else (),
                  attention=True, attention_positions=positions, batch_size=batch_size, padding_side=padding_side,
                  progress=progress)
    x = as_numpy((col.final_values if s == "v" else col.final_resid)[layer])
    if expand_kv and s != "v":
        raise InvalidInputError("expand_kv applies to site='v' only.")
    x = _expand(x, model, expand_kv)
    vm = _value_manifold_from(x, layer=layer, site=s, name=adapter.hook_name(model, layer, s), seed=seed,
                              n_boot=n_boot, n_null=n_null, n_components=10, expand_kv=expand_kv,
                              ci_method=ci_method)
    focusing = _focusing_from(as_numpy(col.attn_entropy_bits), uniform=_uniform_entropy(col.n_tokens.numpy(), positions),
                              positions=positions, seed=seed, n_boot=n_boot)
    align = _alignment_from(vm.coords[:, 0].numpy(), as_numpy(col.next_token_entropy_bits), layer=layer, site=s,
                            seed=seed, n_boot=n_boot, n_perm=n_perm)
    return Geometry(value_manifold=vm, key_orthogonality=keys, attention_focusing=focusing, entropy_alignment=align)


class _CallableModule(types.ModuleType):
    """Lets ``bl.geometry(model, prompts)`` work even when Python binds ``bayes_lens.geometry`` to
    this module (importing a submodule sets the package attribute, shadowing the lazy function)."""

    def __call__(self, *args, **kwargs) -> Geometry:
        return geometry(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
# help(), inspect.signature() and IDEs then show the function's parameters, not (*args, **kwargs)
sys.modules[__name__].__signature__ = inspect.signature(geometry)
