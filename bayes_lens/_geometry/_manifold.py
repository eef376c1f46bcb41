"""Value manifold: standardized PCA of final-token value vectors across prompts.

Paper A ("Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752) §4.2, METHODS.md §1:
final-real-token ``hook_v`` vectors at one layer, all key/value heads concatenated (one n_kv·d_head
sample per prompt), z-scored per coordinate, PCA by SVD in float64. Reports the explained-variance
ratio of PC1 and PC1+PC2 with 95% bootstrap intervals over prompts, the participation ratio
PR = (Σλ)²/Σλ², per-prompt PC coordinates, and a simulated null: the same statistics for standardized
i.i.d. Gaussian data of the same n × d. Resamples with duplicated prompts inflate PC1 when n < d,
so by default the bootstrap interval is recentred on the estimate (``ci_method="recentered"``: it
targets the same-n statistic, the quantity the same-n null is compared with); ``"percentile"`` gives
the plain one. ``site="resid_post"`` is the paper script's variant (final-layer residual states).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from .. import adapter
from .._results import Result, fmt, fmt_ci, fmt_pct, plotly
from ..errors import InvalidInputError
from ..metrics.pca import CI_METHODS, bootstrap_pca_stats, gaussian_null_pca_stats, interval_label, pca, pca_bootstrap_cis
from ..metrics.stats import as_numpy, percentile_interval
from ._sources import check_site, check_stats, expand_kv_heads, resolve_layer, source_collection, source_model

__all__ = ["ValueManifold", "value_manifold", "manifold_from_samples", "CI_METHODS"]

CI = Tuple[float, float]


@dataclass(frozen=True, eq=False)
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
    pc1_ci_label: str = ""
    pc12_ci_label: str = ""
    participation_ratio_ci_label: str = ""
    expand_kv: bool = False
    n_boot: int = 1000
    n_null: int = 200
    seed: int = 0

    def _summary(self):
        title = (f"layer {self.layer} {self.site!r} ({self.hook_name}), n = {self.n_prompts} prompts, "
                 f"dim {self.dim}")
        return title, [
            ("PC1 variance", fmt_pct(self.pc1), fmt_ci(self.pc1_ci, pct=True),
             f"null {fmt_pct(self.null_pc1)} {fmt_ci(self.null_pc1_interval, pct=True)}"),
            ("PC1+PC2 variance", fmt_pct(self.pc12), fmt_ci(self.pc12_ci, pct=True),
             f"null {fmt_pct(self.null_pc12)} {fmt_ci(self.null_pc12_interval, pct=True)}"),
            ("participation ratio", fmt(self.participation_ratio), fmt_ci(self.participation_ratio_ci),
             f"null {fmt(self.null_participation_ratio)} {fmt_ci(self.null_participation_ratio_interval)} (dims)"),
        ]

    def to_dataframe(self):
        """One row per statistic: value, bootstrap CI and the simulated Gaussian null."""
        import pandas as pd

        rows = []
        for stat, val, ci, null, nint, label in (
            ("pc1_explained_variance_fraction", self.pc1, self.pc1_ci, self.null_pc1, self.null_pc1_interval,
             self.pc1_ci_label),
            ("pc12_explained_variance_fraction", self.pc12, self.pc12_ci, self.null_pc12, self.null_pc12_interval,
             self.pc12_ci_label),
            ("participation_ratio_dims", self.participation_ratio, self.participation_ratio_ci,
             self.null_participation_ratio, self.null_participation_ratio_interval, self.participation_ratio_ci_label),
        ):
            rows.append(dict(metric="value_manifold", layer=self.layer, site=self.site, statistic=stat, value=val,
                             ci_low=ci[0], ci_high=ci[1], ci_method=label, null_mean=null, null_low=nint[0],
                             null_high=nint[1], n_prompts=self.n_prompts, dim=self.dim))
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




def manifold_from_samples(x: np.ndarray, *, layer, site, name, seed, n_boot, n_null, n_components,
                          expand_kv, ci_method="recentered") -> ValueManifold:
    """The value-manifold statistics of samples ``x`` [n, d] (float64), with bootstrap CIs and the null."""
    if ci_method not in CI_METHODS:
        raise InvalidInputError(f"ci_method must be one of {CI_METHODS}, got {ci_method!r}.")
    fit = pca(x, n_components=n_components)
    evr = fit.explained_variance_ratio
    pc1, pc12, pr = float(evr[0]), float(evr[:2].sum()), fit.participation_ratio
    boot = bootstrap_pca_stats(x, n_boot=n_boot, seed=seed)
    (pc1_ci, pc12_ci, pr_ci), bias = pca_bootstrap_cis(boot, (pc1, pc12, pr), ci_method)
    null = gaussian_null_pca_stats(x.shape[0], int(fit.kept.sum()), n_sims=n_null, seed=seed + 1)
    return ValueManifold(
        layer=layer, site=site, hook_name=name, n_prompts=x.shape[0], dim=x.shape[1], n_constant_dims=fit.n_constant,
        pc1=pc1, pc12=pc12, pc1_ci=pc1_ci, pc12_ci=pc12_ci,
        participation_ratio=pr, participation_ratio_ci=pr_ci, bootstrap_bias=bias, ci_method=ci_method,
        pc1_ci_label=interval_label("pc1", ci_method, x.shape[0], int(fit.kept.sum())),
        pc12_ci_label=interval_label("pc12", ci_method, x.shape[0], int(fit.kept.sum())),
        participation_ratio_ci_label=interval_label("participation_ratio", ci_method, x.shape[0], int(fit.kept.sum()),
                                                    participation_ratio=pr),
        explained_variance_ratio=evr[: min(len(evr), 20)].copy(),
        null_pc1=float(null[:, 0].mean()), null_pc12=float(null[:, 1].mean()),
        null_participation_ratio=float(null[:, 2].mean()),
        null_pc1_interval=percentile_interval(null[:, 0], min_finite=0.0),
        null_pc12_interval=percentile_interval(null[:, 1], min_finite=0.0),
        null_participation_ratio_interval=percentile_interval(null[:, 2], min_finite=0.0),
        coords=torch.from_numpy(fit.coords.copy()), expand_kv=expand_kv, n_boot=n_boot, n_null=n_null, seed=seed,
    )


def value_manifold(source, prompts=None, *, layer: int = -1, site: str = "v", attention_mask=None,
                   tokens=None, model=None, seed: int = 0, n_boot: int = 1000, n_null: int = 200,
                   n_components: int = 10, expand_kv: bool = False, ci_method: str = "recentered",
                   batch_size: int = 16, padding_side: str = "right",
                   progress: Optional[bool] = None) -> ValueManifold:
    """Standardized PCA of final-token value vectors across prompts (Paper A §4.2; METHODS.md §1).

    ``source`` is a model (then ``prompts`` is a list of ≥ 3 strings), what
    ``run_with_cache`` returned (the ``(logits, cache)`` pair, the cache, or ``dict(cache.items())``
    with ``model=``; made with ``names_filter=bl.hook_filter()``; pass the ``tokens`` you ran, or
    their ``attention_mask``, when the batch is padded) or a :class:`~bayes_lens.collect.Collection`.
    ``site="resid_post"`` uses residual states (the paper script's variant). ``expand_kv=True``
    repeats KV heads to the query-head layout (off: repeated copies inflate PCA). ``n_null``
    Gaussian simulations at the same n × d give the null. ``ci_method`` says what the intervals
    target (:func:`bayes_lens.metrics.pca.bootstrap_interval`): ``"recentered"`` (default) the same-n
    statistic — the quantity the same-n null is compared with; ``"basic"`` the population value
    (covered PC1 and PC1+PC2 at 0.86–0.96 in simulation); ``"percentile"`` the plain interval, biased
    upwards (resamples with duplicated prompts inflate PC1 when n < d). No interval covers the
    population participation ratio when n ≲ d; each result's ``*_ci_label`` names the method used
    and says so.

    Example
    -------
    >>> vm = bl.value_manifold(model, prompts)                          # doctest: +SKIP
    >>> vm.pc12, vm.pc12_ci, vm.null_pc12                               # doctest: +SKIP
    """
    if ci_method not in CI_METHODS:
        raise InvalidInputError(f"ci_method must be one of {CI_METHODS}, got {ci_method!r}.")
    check_stats(seed, n_boot=n_boot, n_null=n_null)
    s = check_site(site)
    if expand_kv and s != "v":
        raise InvalidInputError("expand_kv applies to site='v' only.")
    m = source_model(source, model)
    layers = [adapter.resolve_layer(m, layer)] if m is not None else ()
    col, m = source_collection(source, prompts, layers=layers, site=s, attention_mask=attention_mask,
                               tokens=tokens, model=model, batch_size=batch_size, padding_side=padding_side,
                               progress=progress, desc="value_manifold: collect")
    layer = resolve_layer(col, m, layer, s)
    x = expand_kv_heads(as_numpy(col.values(layer, s)), m, expand_kv)
    return manifold_from_samples(x, layer=layer, site=s, name=adapter.SITES[s].format(layer=layer), seed=seed,
                                 n_boot=n_boot, n_null=n_null, n_components=n_components, expand_kv=expand_kv,
                                 ci_method=ci_method)
