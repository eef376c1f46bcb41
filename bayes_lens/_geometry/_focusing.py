"""Attention focusing: the entropy of attention rows, per layer and head, falling with depth.

Paper A ("Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752) §4.2, §4.5,
METHODS.md §3: per layer and head, the entropy (bits) H = −Σ_j α_j log₂ α_j of the final query row
of ``hook_pattern`` over the valid keys, computed inside the hook; per head first, then averaged over
heads, then over prompts (bootstrap CIs). Reports the reduction (H_first − H_last)/H_first (Paper A's
pass threshold > 30%), monotonicity (Spearman of depth vs entropy; the number of layers where
entropy rises), and the same row entropy under uniform attention as a no-focusing reference;
``positions="all"`` averages over every real query row (Paper A §4.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from .. import adapter
from .._results import Estimate, Result, fmt, fmt_ci, fmt_pct, plotly
from .._validate import check_positions
from ..errors import InvalidInputError
from ..metrics.stats import as_numpy, bootstrap_indices, percentile_interval, spearman_rows
from .._inputs import as_reduced
from ._sources import check_stats

__all__ = ["AttentionFocusing", "attention_focusing", "focusing_from_entropies", "uniform_entropy_bits",
           "focusing_uniform"]

CI = Tuple[float, float]


@dataclass(frozen=True, eq=False)
class AttentionFocusing(Result):
    """Attention entropy (bits) per layer and head over prompts (METHODS.md §3).

    ``reduction`` and ``depth_spearman`` are :class:`~bayes_lens.Estimate` values with percentile
    bootstrap intervals over prompts (``null`` 0: no focusing / no trend with depth).
    """

    layer_entropy_bits: torch.Tensor  # [n_layers]: mean over prompts of the per-prompt head mean
    layer_entropy_ci: torch.Tensor  # [n_layers, 2]
    head_entropy_bits: torch.Tensor  # [n_layers, n_heads]
    reduction: Estimate  # (H_first − H_last) / H_first, a fraction
    depth_spearman: Estimate  # Spearman(layer index, layer entropy): negative = focusing with depth
    n_rises: int  # layers whose entropy exceeds the previous layer's
    uniform_entropy_bits: float  # the same row entropy under uniform attention (a no-focusing null), layer mean
    positions: str = "last"
    n_prompts: int = 0
    layer_uniform_entropy_bits: Optional[torch.Tensor] = None  # [n_layers]: per layer (sliding windows see fewer keys)
    paper_threshold: float = 0.30

    @property
    def monotone(self) -> bool:
        return self.n_rises == 0

    def _summary(self):
        h = self.layer_entropy_bits.double()
        title = f"{int(h.shape[0])} layers, {self.positions} positions, n = {self.n_prompts} prompts"
        return title, [
            ("entropy first -> last layer", f"{fmt(h[0])} -> {fmt(h[-1])} bits", "",
             f"uniform attention {fmt(self.uniform_entropy_bits)} bits"),
            ("reduction (H_first - H_last)/H_first", fmt_pct(self.reduction), fmt_ci(self.reduction, pct=True),
             f"paper threshold {fmt_pct(self.paper_threshold)}"),
            ("Spearman(layer, entropy)", fmt(self.depth_spearman), fmt_ci(self.depth_spearman),
             f"{self.n_rises} rise(s) between layers"),
        ]

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
        u = self.layer_uniform_entropy_bits
        if u is not None and float(u.max() - u.min()) > 1e-9:  # sliding-window layers see fewer keys
            fig.add_scatter(x=x, y=u.tolist(), mode="lines", line_dash="dash", name="uniform attention")
        else:
            fig.add_hline(y=self.uniform_entropy_bits, line_dash="dash", annotation_text="uniform attention")
        fig.update_layout(title=f"Attention focusing: reduction {self.reduction:.1%}", xaxis_title="layer",
                          yaxis_title="attention entropy (bits)")
        return fig




def _depth_spearman(curves: np.ndarray) -> np.ndarray:
    """Spearman of (layer index, entropy) per row of ``curves`` [..., n_layers]."""
    depth = np.arange(curves.shape[-1], dtype=np.float64)
    return spearman_rows(np.broadcast_to(depth, curves.shape), curves)


def focusing_from_entropies(ent: np.ndarray, *, uniform, positions: str, seed: int,
                            n_boot: int) -> AttentionFocusing:
    """Focusing statistics from ``ent`` [n, n_layers, n_heads] per-prompt per-head entropies (bits).

    ``uniform``: the no-focusing reference (:func:`uniform_entropy_bits`), one number or one per layer.
    """
    uniform_layers = np.broadcast_to(np.asarray(uniform, dtype=np.float64), (ent.shape[1],)).copy()
    n = ent.shape[0]
    if n < 1:
        raise InvalidInputError("attention focusing needs at least one prompt.")
    per_prompt = ent.mean(axis=2)  # per head first, then the head mean: [n, L]
    curve = per_prompt.mean(axis=0)

    def reduction(c):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (c[..., 0] - c[..., -1]) / c[..., 0]

    idx = bootstrap_indices(n, n_boot, seed=seed)
    boot = per_prompt[idx].mean(axis=1)  # [B, L]
    lo, hi = percentile_interval(boot, axis=0, min_finite=0.0) if n > 1 else (np.full_like(curve, np.nan),) * 2
    nan_ci = (float("nan"), float("nan"))
    method = "95% percentile bootstrap over prompts"
    return AttentionFocusing(
        layer_entropy_bits=torch.from_numpy(curve.copy()),
        layer_entropy_ci=torch.from_numpy(np.stack([lo, hi], axis=1)),
        head_entropy_bits=torch.from_numpy(ent.mean(axis=0)),
        reduction=Estimate(float(reduction(curve)),
                           percentile_interval(reduction(boot), min_finite=0.0) if n > 1 else nan_ci, method,
                           null=0.0, n=n),
        depth_spearman=Estimate(float(_depth_spearman(curve)),
                                percentile_interval(_depth_spearman(boot), min_finite=0.0) if n > 1 else nan_ci,
                                method, null=0.0, n=n),
        n_rises=int((np.diff(curve) > 0).sum()), uniform_entropy_bits=float(uniform_layers.mean()),
        layer_uniform_entropy_bits=torch.from_numpy(uniform_layers), positions=positions, n_prompts=n,
    )


def uniform_entropy_bits(n_tokens: np.ndarray, positions: str, windows: Optional[Sequence[Optional[int]]] = None):
    """Mean entropy (bits) of the same attention rows under uniform attention over the keys they see.

    A query at position q of a prompt of n real tokens sees min(q + 1, W) keys in a layer with a
    sliding window W (None: global), so uniform attention has log₂ of that. ``positions="last"``:
    the mean over prompts of log₂ min(n, W); ``"all"``: of the mean over q of log₂ min(q + 1, W).
    Without ``windows`` every layer is global and one number is returned; with one window per layer,
    an array ``[n_layers]``.
    """
    n_tokens = np.asarray(n_tokens, dtype=np.float64)

    def one(window):
        cap = np.inf if window is None else float(window)
        if positions == "last":
            return float(np.log2(np.minimum(n_tokens, cap)).mean())
        return float(np.mean([np.log2(np.minimum(np.arange(1, int(t) + 1), cap)).mean() for t in n_tokens]))

    if windows is None:
        return one(None)
    return np.array([one(w) for w in windows], dtype=np.float64)


def focusing_uniform(rc, model, positions: str):
    """Per-layer uniform baselines of a reduced cache's prompts when the model (its windows) is known, else
    the global one."""
    if model is None:
        return uniform_entropy_bits(rc.n_tokens.numpy(), positions)
    windows = [adapter.attention_window(model, layer) for layer in range(int(model.cfg.n_layers))]
    if all(w is None for w in windows):
        return uniform_entropy_bits(rc.n_tokens.numpy(), positions)
    return uniform_entropy_bits(rc.n_tokens.numpy(), positions, windows)


def attention_focusing(source, prompts=None, *, positions: str = "last", attention_mask=None, tokens=None,
                       model=None, seed: int = 0, n_boot: int = 1000, batch_size: int = 16,
                       padding_side: str = "right", progress: Optional[bool] = None) -> AttentionFocusing:
    """Per-layer, per-head attention entropy of the final query row over valid keys (METHODS.md §3).

    ``positions="all"`` averages over every real query row (Paper A §4.5). From a cache, every
    layer's ``hook_pattern`` (``names_filter=bl.hook_filter()``) or, inside ``bl.attach(model)``, the
    much smaller ``hook_pattern_entropy`` must be present; pass the ``tokens`` (or
    ``attention_mask``) of a padded batch.

    Example
    -------
    >>> af = bl.attention_focusing(model, prompts, n_boot=200)
    >>> H = af.layer_entropy_bits.tolist()                    # one mean entropy per layer (bits)
    >>> len(H), bool(np.isclose(af.reduction.value, (H[0] - H[-1]) / H[0]))
    (2, True)
    """
    check_positions(positions)
    check_stats(seed, n_boot=n_boot)
    rc, m = as_reduced(source, prompts, model=model, attention=True, attention_positions=positions,
                       attention_mask=attention_mask, tokens=tokens, batch_size=batch_size,
                       padding_side=padding_side, progress=progress, desc="attention_focusing: collect")
    entropies = rc.attention_entropy_bits(None if m is None else int(m.cfg.n_layers))
    return focusing_from_entropies(as_numpy(entropies), uniform=focusing_uniform(rc, m, positions),
                                   positions=positions, seed=seed, n_boot=n_boot)
