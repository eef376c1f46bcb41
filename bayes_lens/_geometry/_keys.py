"""Key orthogonality: mean off-diagonal |cos| of the columns of W_K per layer and KV head.

Paper A ("Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752) §4.2, METHODS.md §2:
per layer and KV head, the mean off-diagonal |cos| of the ℓ2-normalized d_head columns of
W_K ∈ R^{d_model×d_head} (raw weights), next to the exact dimension-matched Gaussian
E|cos| = Γ(d/2)/(√π Γ((d+1)/2)) with d = d_model, a simulated distribution for the same W_K shape,
the paper's √(2/(π d_head)) (labelled as its convention), and optionally the same metric on a
``reference`` model (e.g. an untrained copy). Paper A's pass threshold: < 0.20 in ≥ 50% of layers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from .. import adapter
from .._results import Result, fmt, fmt_ci, fmt_pct, plotly
from .._inputs import is_cache_like
from ..reduced import ReducedCache
from .._validate import check_choice
from ..errors import BayesLensError, InvalidInputError
from ..metrics.keys import (
    gaussian_abs_cosine, mean_abs_offdiag_cosine, paper_abs_cosine_baseline, simulate_gaussian_abs_cosine,
)
from ..metrics.stats import percentile_interval

__all__ = ["KeyOrthogonality", "key_orthogonality", "key_stats"]

CI = Tuple[float, float]


@dataclass(frozen=True, eq=False)
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

    def _summary(self):
        lm = self.layer_mean.double()
        title = (f"{int(self.per_head.shape[0])} layers x {int(self.per_head.shape[1])} KV heads, "
                 f"d_model {self.d_model}, d_head {self.d_head}, {self.processing}")
        return title, [
            ("mean off-diagonal |cos|", fmt(lm.mean()), f"[{fmt(lm.min())}, {fmt(lm.max())}]", "range over layers"),
            ("Gaussian baseline", fmt(self.gaussian_baseline), fmt_ci(self.gaussian_simulated_interval),
             f"simulated {fmt(self.gaussian_simulated_mean)}"),
            ("layers below the paper's threshold", fmt_pct(self.fraction_layers_below_threshold), "",
             f"mean |cos| < {self.paper_threshold:g}; paper baseline {fmt(self.paper_baseline)}"),
        ]

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




def key_stats(model, info) -> np.ndarray:
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
    check_choice(on_processed, "on_processed", ("warn", "error", "ignore"))
    if is_cache_like(model) or isinstance(model, ReducedCache):
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
    per_head = key_stats(model, info)
    ref = None
    if reference is not None:
        if (rinfo.n_layers, rinfo.n_kv_heads, rinfo.d_model, rinfo.d_head) != (
                info.n_layers, info.n_kv_heads, info.d_model, info.d_head):
            raise InvalidInputError(
                "the reference model's shape (layers, KV heads, d_model, d_head) "
                f"{(rinfo.n_layers, rinfo.n_kv_heads, rinfo.d_model, rinfo.d_head)} differs from the model's "
                f"{(info.n_layers, info.n_kv_heads, info.d_model, info.d_head)}.")
        ref = key_stats(reference, rinfo)
    sims = simulate_gaussian_abs_cosine(info.d_model, info.d_head, n_sims=n_sims, seed=seed)
    t = torch.from_numpy
    return KeyOrthogonality(
        per_head=t(per_head), layer_mean=t(per_head.mean(axis=1)),
        layer_percentiles=t(np.percentile(per_head, [10, 50, 90], axis=1).T.copy()),
        percentiles=tuple(float(q) for q in np.percentile(per_head, [10, 50, 90])),
        d_model=info.d_model, d_head=info.d_head,
        gaussian_baseline=gaussian_abs_cosine(info.d_model),
        gaussian_simulated_mean=float(sims.mean()), gaussian_simulated_interval=percentile_interval(sims, min_finite=0.0),
        paper_baseline=paper_abs_cosine_baseline(info.d_head),
        reference_per_head=None if ref is None else t(ref),
        reference_layer_mean=None if ref is None else t(ref.mean(axis=1)),
        processed=info.processed, processing=info.processing,
    )


