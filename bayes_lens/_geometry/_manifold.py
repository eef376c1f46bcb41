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
from .._results import Estimate, Result, fmt, fmt_ci, fmt_pct, plotly
from .._validate import check_choice
from ..errors import InvalidInputError
from ..metrics.pca import CI_METHODS, bootstrap_pca_stats, gaussian_null_pca_stats, interval_label, pca, pca_bootstrap_cis
from ..metrics.stats import as_numpy, percentile_interval
from .._inputs import as_reduced
from ._sources import check_site, check_stats, expand_kv_heads, resolve_layer

__all__ = ["ValueManifold", "value_manifold", "manifold_from_samples", "CI_METHODS"]

CI = Tuple[float, float]


@dataclass(frozen=True, eq=False)
class ValueManifold(Result):
    """Standardized PCA of final-token value (or residual) vectors across prompts (METHODS.md §1).

    ``pc1``, ``pc12`` (explained-variance fractions) and ``participation_ratio`` (dimensions) are
    :class:`~bayes_lens.Estimate` values: the bootstrap interval over prompts (``ci_method`` names the
    method and what it targets), and as ``null`` / ``null_interval`` the mean and 2.5–97.5% range of
    the same statistic for standardized i.i.d. Gaussian data of the same n × d.
    """

    layer: int
    site: str
    hook_name: str
    n_prompts: int
    dim: int
    n_constant_dims: int
    pc1: Estimate  # PC1 explained-variance fraction; null: standardized i.i.d. Gaussian n × d data
    pc12: Estimate  # PC1+PC2 fraction
    participation_ratio: Estimate  # (Σλ)²/Σλ², dimensions
    explained_variance_ratio: np.ndarray  # leading components
    coords: torch.Tensor  # [n_prompts, n_components]
    bootstrap_bias: Tuple[float, float, float] = (0.0, 0.0, 0.0)  # median(boot) − estimate: PC1, PC1+2, PR
    ci_method: str = "recentered"  # the option chosen; each Estimate's ci_method is the full label
    expand_kv: bool = False
    n_boot: int = 1000
    n_null: int = 200
    seed: int = 0

    def _summary(self):
        title = (f"layer {self.layer} {self.site!r} ({self.hook_name}), n = {self.n_prompts} prompts, "
                 f"dim {self.dim}")
        return title, [
            ("PC1 variance", fmt_pct(self.pc1), fmt_ci(self.pc1, pct=True),
             f"null {fmt_pct(self.pc1.null)} {fmt_ci(self.pc1.null_interval, pct=True)}"),
            ("PC1+PC2 variance", fmt_pct(self.pc12), fmt_ci(self.pc12, pct=True),
             f"null {fmt_pct(self.pc12.null)} {fmt_ci(self.pc12.null_interval, pct=True)}"),
            ("participation ratio", fmt(self.participation_ratio), fmt_ci(self.participation_ratio),
             f"null {fmt(self.participation_ratio.null)} {fmt_ci(self.participation_ratio.null_interval)} (dims)"),
        ]

    def to_dataframe(self):
        """One row per statistic: value, bootstrap CI and the simulated Gaussian null."""
        import pandas as pd

        rows = []
        for stat, est in (("pc1_explained_variance_fraction", self.pc1), ("pc12_explained_variance_fraction", self.pc12),
                          ("participation_ratio_dims", self.participation_ratio)):
            rows.append(dict(metric="value_manifold", layer=self.layer, site=self.site, statistic=stat,
                             value=est.value, ci_low=est.ci_low, ci_high=est.ci_high, ci_method=est.ci_method,
                             null_mean=est.null, null_low=est.null_interval[0], null_high=est.null_interval[1],
                             n_prompts=self.n_prompts, dim=self.dim))
        return pd.DataFrame(rows)

    def plot(self):
        """Explained-variance ratio of the leading components against the Gaussian null's PC1."""
        go = plotly()
        k = len(self.explained_variance_ratio)
        fig = go.Figure()
        fig.add_bar(x=[f"PC{i + 1}" for i in range(k)], y=list(self.explained_variance_ratio), name="model")
        fig.add_hline(y=self.pc1.null, line_dash="dash", annotation_text="Gaussian null PC1")
        fig.update_layout(title=f"Value manifold, layer {self.layer} ({self.site}); PC1+PC2 = {self.pc12:.1%}",
                          yaxis_title="explained variance fraction")
        return fig




def manifold_from_samples(x: np.ndarray, *, layer, site, name, seed, n_boot, n_null, n_components,
                          expand_kv, ci_method="recentered") -> ValueManifold:
    """The value-manifold statistics of samples ``x`` [n, d] (float64), with bootstrap CIs and the null."""
    check_choice(ci_method, "ci_method", CI_METHODS)
    fit = pca(x, n_components=n_components)
    evr = fit.explained_variance_ratio
    pc1, pc12, pr = float(evr[0]), float(evr[:2].sum()), fit.participation_ratio
    boot = bootstrap_pca_stats(x, n_boot=n_boot, seed=seed)
    (pc1_ci, pc12_ci, pr_ci), bias = pca_bootstrap_cis(boot, (pc1, pc12, pr), ci_method)
    n, d = x.shape[0], int(fit.kept.sum())
    null = gaussian_null_pca_stats(n, d, n_sims=n_null, seed=seed + 1)

    def est(j, value, ci, stat):
        label = interval_label(stat, ci_method, n, d, **({"participation_ratio": pr} if j == 2 else {}))
        return Estimate(value, ci, label, null=float(null[:, j].mean()),
                        null_interval=percentile_interval(null[:, j], min_finite=0.0), n=n)

    return ValueManifold(
        layer=layer, site=site, hook_name=name, n_prompts=n, dim=x.shape[1], n_constant_dims=fit.n_constant,
        pc1=est(0, pc1, pc1_ci, "pc1"), pc12=est(1, pc12, pc12_ci, "pc12"),
        participation_ratio=est(2, pr, pr_ci, "participation_ratio"), bootstrap_bias=bias, ci_method=ci_method,
        explained_variance_ratio=evr[: min(len(evr), 20)].copy(),
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
    their ``attention_mask``, when the batch is padded) or a :class:`~bayes_lens.reduced.ReducedCache`.
    ``site="resid_post"`` uses residual states (the paper script's variant). ``expand_kv=True``
    repeats KV heads to the query-head layout (off: repeated copies inflate PCA). ``n_null``
    Gaussian simulations at the same n × d give the null. ``ci_method`` says what the intervals
    target (:func:`bayes_lens.metrics.pca.bootstrap_interval`): ``"recentered"`` (default) the same-n
    statistic — the quantity the same-n null is compared with; ``"basic"`` the population value
    (covered PC1 and PC1+PC2 at 0.86–0.96 in simulation); ``"percentile"`` the plain interval, biased
    upwards (resamples with duplicated prompts inflate PC1 when n < d). No interval covers the
    population participation ratio when n ≲ d; each Estimate's ``ci_method`` names the method used
    and says so.

    Example
    -------
    >>> vm = bl.value_manifold(model, prompts, n_boot=200, n_null=50)
    >>> vm.hook_name, vm.n_prompts
    ('blocks.1.attn.hook_v', 8)
    >>> bool(0 < vm.pc1.value < vm.pc12.value < 1 and vm.pc12.ci_low <= vm.pc12.value <= vm.pc12.ci_high)
    True
    >>> bool(np.isclose(vm.pc12.value, vm.explained_variance_ratio[:2].sum()))
    True
    """
    check_choice(ci_method, "ci_method", CI_METHODS)
    check_stats(seed, n_boot=n_boot, n_null=n_null)
    s = check_site(site)
    if expand_kv and s != "v":
        raise InvalidInputError("expand_kv applies to site='v' only.")
    rc, m = as_reduced(source, prompts, model=model, attention_mask=attention_mask, tokens=tokens,
                       **{"value_layers" if s == "v" else "resid_layers": [layer]}, batch_size=batch_size,
                       padding_side=padding_side, progress=progress, desc="value_manifold: collect", min_prompts=3)
    layer = resolve_layer(rc, m, layer, s)
    x = expand_kv_heads(as_numpy(rc.value_rows(layer, s)), m, expand_kv)
    return manifold_from_samples(x, layer=layer, site=s, name=adapter.SITES[s].format(layer=layer), seed=seed,
                                 n_boot=n_boot, n_null=n_null, n_components=n_components, expand_kv=expand_kv,
                                 ci_method=ci_method)
