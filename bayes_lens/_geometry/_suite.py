"""The geometry suite: value manifold, key orthogonality, focusing and alignment from one pass.

Paper A ("Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752) §4.2 and §5.1,
METHODS.md §1–§4. One batched forward pass keeps only the final-token rows at ``layer`` and the
per-head attention entropies (the unembedding only at the final token); each statistic is that of
its own module (:mod:`._manifold`, :mod:`._keys`, :mod:`._focusing`, :mod:`._alignment`), so
``bl.geometry(...)`` and the four single metrics give the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import adapter
from .._inputs import as_reduced
from .._results import Result, fmt, fmt_ci, fmt_pct, plotly
from .._validate import check_choice, check_positions
from ..errors import InvalidInputError
from ..metrics.stats import as_numpy
from ._alignment import EntropyAlignment, alignment_from
from ._focusing import AttentionFocusing, focusing_from_entropies, focusing_uniform
from ._keys import KeyOrthogonality, key_orthogonality
from ._manifold import CI_METHODS, ValueManifold, manifold_from_samples
from ._sources import check_site, check_stats, expand_kv_heads

__all__ = ["Geometry", "geometry"]


@dataclass(frozen=True, eq=False)
class Geometry(Result):
    """All four geometry measurements of one model on one prompt set."""

    value_manifold: ValueManifold
    key_orthogonality: KeyOrthogonality
    attention_focusing: AttentionFocusing
    entropy_alignment: EntropyAlignment

    def _arrays(self) -> str:
        return "value_manifold, key_orthogonality, attention_focusing, entropy_alignment (each with its own repr)"

    def _summary(self):
        vm, ko, af, ea = self.value_manifold, self.key_orthogonality, self.attention_focusing, self.entropy_alignment
        title = f"n = {vm.n_prompts} prompts, value manifold at layer {vm.layer} {vm.site!r}"
        lm = ko.layer_mean.double()
        return title, [
            ("PC1+PC2 variance", fmt_pct(vm.pc12), fmt_ci(vm.pc12, pct=True),
             f"null {fmt_pct(vm.pc12.null)}; PC1 alone {fmt_pct(vm.pc1)}"),
            ("participation ratio", fmt(vm.participation_ratio), fmt_ci(vm.participation_ratio),
             f"null {fmt(vm.participation_ratio.null)}"),
            ("key |cos| (mean over layers)", fmt(lm.mean()), "", f"Gaussian {fmt(ko.gaussian_baseline)}"),
            ("attention entropy reduction", fmt_pct(af.reduction), fmt_ci(af.reduction, pct=True),
             f"{af.n_rises} rise(s)"),
            ("rho(PC1, entropy)", fmt(ea.spearman), fmt_ci(ea.spearman), f"p = {fmt(ea.spearman_pvalue, 3)}"),
        ]

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
            sub = part.plot()
            for trace in sub.data:
                fig.add_trace(trace, row=r, col=c)
            # each panel keeps its axis titles and its baselines (the Gaussian null, the paper's key baseline,
            # uniform attention): horizontal reference lines with their labels
            fig.update_xaxes(title_text=sub.layout.xaxis.title.text or "principal component", row=r, col=c)
            fig.update_yaxes(title_text=sub.layout.yaxis.title.text, row=r, col=c)
            labels = [a.text for a in sub.layout.annotations]
            for i, shape in enumerate(sub.layout.shapes):
                if shape.type == "line" and shape.y0 == shape.y1 and shape.yref == "y":
                    fig.add_hline(y=shape.y0, line_dash=shape.line.dash or "dot", line_color=shape.line.color or "gray",
                                  annotation_text=labels[i] if i < len(labels) else None,
                                  annotation_font_size=10, row=r, col=c)
        fig.update_layout(showlegend=False, title="Bayesian geometry", height=700)
        return fig




def geometry(source, prompts=None, *, layer: int = -1, site: str = "v", positions: str = "last",
             reference=None, attention_mask=None, tokens=None, logits=None, model=None, seed: int = 0,
             n_boot: int = 1000, n_null: int = 200, n_perm: int = 1000, expand_kv: bool = False,
             ci_method: str = "recentered", batch_size: int = 16, padding_side: str = "right",
             on_processed: str = "warn", progress: Optional[bool] = None) -> Geometry:
    """Value manifold, key orthogonality, attention focusing and entropy alignment in one pass.

    ``source``: a model with ``prompts`` (one batched forward pass keeps the final-token
    rows at ``layer`` and the per-head attention entropies), what ``run_with_cache`` returned (the
    ``(logits, cache)`` pair, or the cache / ``dict(cache.items())`` with ``logits=``, holding
    ``hook_v`` and ``hook_pattern``; key orthogonality then reads the weights of the model the cache
    records, or ``model=``), or a reduced cache (:func:`bayes_lens.collect.collect`,
    :func:`bayes_lens.shard.merge`) with ``model=``. The statistics follow METHODS.md §1–§4; see each
    metric's function for its parameters. To run it in shards, call it inside
    ``with bl.shard.sharded(...)`` (batch-aligned shards give the one-process numbers).

    Example
    -------
    >>> geo = bl.geometry(model, prompts, n_boot=200, n_null=50, n_perm=200)
    >>> geo.value_manifold.pc12 == bl.value_manifold(model, prompts, n_boot=200, n_null=50).pc12
    True
    >>> sorted(set(geo.to_dataframe()["metric"]))
    [...]
    >>> type(geo.plot()).__name__
    'Figure'
    """
    s = check_site(site)
    check_stats(seed, n_boot=n_boot, n_null=n_null, n_perm=n_perm)
    check_positions(positions)
    check_choice(ci_method, "ci_method", CI_METHODS)
    if expand_kv and s != "v":
        raise InvalidInputError("expand_kv applies to site='v' only.")
    rc, m = as_reduced(source, prompts, model=model, logits=logits, attention_mask=attention_mask,
                       tokens=tokens, **{"value_layers" if s == "v" else "resid_layers": [layer]}, attention=True,
                       attention_positions=positions, batch_size=batch_size, padding_side=padding_side,
                       progress=progress, desc="geometry: collect", min_prompts=3)
    if m is None:
        raise InvalidInputError("geometry() needs the model (key orthogonality reads its weights): pass a model "
                                "with prompts, a cache that records its model, or model=.")
    layer = adapter.resolve_layer(m, layer)
    keys = key_orthogonality(m, reference=reference, seed=seed, on_processed=on_processed)
    x = expand_kv_heads(as_numpy(rc.value_rows(layer, s)), m, expand_kv)
    vm = manifold_from_samples(x, layer=layer, site=s, name=adapter.SITES[s].format(layer=layer), seed=seed,
                               n_boot=n_boot, n_null=n_null, n_components=10, expand_kv=expand_kv,
                               ci_method=ci_method)
    focusing = focusing_from_entropies(as_numpy(rc.attention_entropy_bits(int(m.cfg.n_layers))),
                                       uniform=focusing_uniform(rc, m, positions), positions=positions, seed=seed,
                                       n_boot=n_boot)
    align = alignment_from(vm.coords[:, 0].numpy(), as_numpy(rc.next_token_entropy_bits()), layer=layer, site=s,
                           seed=seed, n_boot=n_boot, n_perm=n_perm)
    return Geometry(value_manifold=vm, key_orthogonality=keys, attention_focusing=focusing, entropy_alignment=align)
