"""Entropy alignment: does the value manifold's PC1 track the model's next-token entropy?

Paper A ("Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752) §5.1, METHODS.md §4:
the Spearman (and Pearson) correlation of the per-prompt PC1 coordinate of the value manifold
(standardized PCA of final-token values, METHODS.md §1) with the model's full-vocabulary next-token
entropy in bits, with a 95% percentile bootstrap interval and a permutation p-value (independent
random streams, :func:`bayes_lens.metrics.stats.correlation_inference`). The sign of a principal
component is arbitrary, so ρ and |ρ| are both reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from .._results import Estimate, Result, fmt, fmt_ci, plotly
from ..errors import InvalidInputError
from ..metrics.pca import pca
from ..metrics.stats import as_numpy, correlation_inference
from .._inputs import as_reduced
from ._sources import check_site, check_stats, resolve_layer

__all__ = ["EntropyAlignment", "entropy_alignment", "alignment_from"]

CI = Tuple[float, float]


@dataclass(frozen=True, eq=False)
class EntropyAlignment(Result):
    """Correlation of the per-prompt PC1 coordinate with next-token entropy (METHODS.md §4).

    ``spearman`` and ``pearson`` are :class:`~bayes_lens.Estimate` values (95% percentile bootstrap
    over prompts, ``null`` 0); ``*_pvalue`` are two-sided permutation p-values.
    """

    spearman: Estimate
    spearman_pvalue: float
    pearson: Estimate
    pearson_pvalue: float
    layer: int
    site: str
    n_prompts: int
    pc1_coords: torch.Tensor  # [n]
    entropy_bits: torch.Tensor  # [n] next-token entropy (full vocabulary)

    @property
    def abs_spearman(self) -> float:
        return abs(self.spearman.value)

    @property
    def abs_pearson(self) -> float:
        return abs(self.pearson.value)

    def _summary(self):
        title = f"PC1 of layer {self.layer} {self.site!r} vs next-token entropy, n = {self.n_prompts} prompts"
        return title, [
            ("Spearman rho", fmt(self.spearman), fmt_ci(self.spearman), f"p = {fmt(self.spearman_pvalue, 3)}"),
            ("Pearson r", fmt(self.pearson), fmt_ci(self.pearson), f"p = {fmt(self.pearson_pvalue, 3)}"),
        ]

    def to_dataframe(self):
        import pandas as pd

        rows = [dict(metric="entropy_alignment", layer=self.layer, site=self.site, statistic=name, value=e.value,
                     abs_value=abs(e.value), ci_low=e.ci_low, ci_high=e.ci_high, permutation_pvalue=p,
                     n_prompts=self.n_prompts)
                for name, e, p in (("spearman_rho", self.spearman, self.spearman_pvalue),
                                   ("pearson_r", self.pearson, self.pearson_pvalue))]
        return pd.DataFrame(rows)

    def plot(self):
        go = plotly()
        fig = go.Figure()
        fig.add_scatter(x=self.pc1_coords.tolist(), y=self.entropy_bits.tolist(), mode="markers")
        fig.update_layout(title=f"PC1 vs next-token entropy: Spearman ρ = {self.spearman:+.2f}",
                          xaxis_title=f"PC1 coordinate (layer {self.layer}, {self.site})",
                          yaxis_title="next-token entropy (bits)")
        return fig




def alignment_from(coords: np.ndarray, ent: np.ndarray, *, layer, site, seed, n_boot, n_perm) -> EntropyAlignment:
    """Spearman and Pearson inference of PC1 coordinates ``coords`` [n] against entropies ``ent`` [n]."""
    coords, ent = as_numpy(coords).ravel(), as_numpy(ent).ravel()
    if coords.shape[0] < 3:
        raise InvalidInputError(f"entropy alignment needs at least 3 prompts, got {coords.shape[0]}.")
    if coords.shape != ent.shape:
        raise InvalidInputError(f"{coords.shape[0]} activation rows but {ent.shape[0]} entropies.")
    rho = correlation_inference(coords, ent, method="spearman", n_boot=n_boot, n_perm=n_perm, seed=seed)
    r = correlation_inference(coords, ent, method="pearson", n_boot=n_boot, n_perm=n_perm, seed=seed)
    n = coords.shape[0]
    method = "95% percentile bootstrap over prompts"
    return EntropyAlignment(
        spearman=Estimate(rho.value, rho.ci, method, null=0.0, n=n), spearman_pvalue=rho.pvalue,
        pearson=Estimate(r.value, r.ci, method, null=0.0, n=n), pearson_pvalue=r.pvalue, layer=layer, site=site, n_prompts=coords.shape[0],
        pc1_coords=torch.from_numpy(coords.copy()), entropy_bits=torch.from_numpy(ent.copy()),
    )


def entropy_alignment(source, prompts=None, *, layer: int = -1, site: str = "v", attention_mask=None,
                      tokens=None, logits=None, model=None, seed: int = 0, n_boot: int = 1000, n_perm: int = 1000,
                      batch_size: int = 16, padding_side: str = "right",
                      progress: Optional[bool] = None) -> EntropyAlignment:
    """Spearman/Pearson of the per-prompt PC1 coordinate with next-token entropy (METHODS.md §4).

    PC1 is that of the standardized PCA of :func:`bayes_lens.value_manifold` at ``layer``/``site``.
    From a cache pass the ``(logits, cache)`` pair ``run_with_cache`` returns (or ``logits=``), and
    the ``tokens`` (or ``attention_mask``) when padded.

    Example
    -------
from .._results import Estimate, Result, fmt, fmt_ci, plotly
    """
    s = check_site(site)
    check_stats(seed, n_boot=n_boot, n_perm=n_perm)
    rc, m = as_reduced(source, prompts, model=model, logits=logits, attention_mask=attention_mask,
                       tokens=tokens, **{"value_layers" if s == "v" else "resid_layers": [layer]},
                       batch_size=batch_size, padding_side=padding_side, progress=progress,
                       desc="entropy_alignment: collect", min_prompts=3)
    layer = resolve_layer(rc, m, layer, s)
    x = as_numpy(rc.value_rows(layer, s))
    ent = as_numpy(rc.next_token_entropy_bits())
    if x.shape[0] < 3:
        raise InvalidInputError(f"entropy alignment needs at least 3 prompts, got {x.shape[0]}.")
    coords = pca(x, n_components=1).coords[:, 0]
    return alignment_from(coords, ent, layer=layer, site=s, seed=seed, n_boot=n_boot, n_perm=n_perm)
