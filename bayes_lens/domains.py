"""Domain restriction: the geometry on a mixed prompt set and on restricted domains, side by side.

Paper A (§4.2, §5.1) reports that restricting prompts to one domain "collapses" the value
manifold onto fewer dimensions: PC1+PC2 of the final-token value vectors goes from 51.4% (mixed)
to 73.6% (mathematics) on Llama-3.2-1B, and 99.7% → 99.9% on Pythia-410M (METHODS.md §5).
:func:`compare_domains` repeats that comparison on any TransformerLens model:

1. for every domain, draw ``n_prompts`` prompts stratified by the model's next-token entropy quintiles
   (:func:`bayes_lens.prompts.select`: the shipped pools ``"mixed"``, ``"math"``, ``"code"``,
   ``"philosophy"`` or a user pool);
2. run them once (:func:`bayes_lens.collect.collect`) and measure, exactly as
   :func:`bayes_lens.geometry` does (same seeds, same numbers): the value manifold (PC1, PC1+PC2,
   participation ratio, each with a 95% bootstrap CI and the simulated i.i.d. Gaussian null of the
   same n × d, METHODS.md §1), attention focusing (§3) and entropy alignment ρ(PC1, H) (§4). Key
   orthogonality (§2) reads weights only, so it is the same for every domain and is reported once;
3. compare each domain with the ``reference`` (default ``"mixed"``): the difference of PC1,
   PC1+PC2 and the participation ratio with a 95% bootstrap CI, resampling each domain's prompts
   independently. A restricted domain "collapses the manifold" when the PC1+PC2 difference's CI
   lies above 0 (and its participation-ratio difference is below 0).

The interval of a difference follows ``ci_method`` like the per-domain intervals (default
``"recentered"``: the percentile interval of the bootstrap differences shifted so that its median
sits on the observed difference; ``"percentile"`` is the plain one). See
:func:`bayes_lens.value_manifold` for why resampling prompts biases PC1 upwards when n < d.

Example
-------
>>> import bayes_lens as bl
>>> model = bl.load_model()                                              # doctest: +SKIP
>>> cmp = bl.compare_domains(model, ("mixed", "math", "code", "philosophy"), n_prompts=75, seed=0)  # doctest: +SKIP
>>> cmp.to_dataframe()[["domain", "pc12_fraction", "pc12_ci_low", "pc12_ci_high"]]  # doctest: +SKIP
>>> cmp.pc12_diff["math"].value, cmp.pc12_diff["math"].ci                 # doctest: +SKIP
>>> cmp.plot()                                                          # doctest: +SKIP
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import adapter
from ._results import Estimate, Result, fmt, fmt_ci, fmt_pct, plotly
from ._validate import check_choice
from .errors import InvalidInputError

__all__ = ["DomainComparison", "compare_domains", "PAPER_A_PC12", "DEFAULT_POOL_SIZE"]

DEFAULT_POOL_SIZE = 150  # candidates scored per shipped pool by default (a seeded subsample)

# Paper A, PC1+PC2 explained variance (fractions), mixed -> maths (METHODS.md §5)
PAPER_A_PC12 = {
    "Pythia-410M": (0.997, 0.999),
    "Phi-2": (0.606, 0.635),
    "Llama-3.2-1B": (0.514, 0.736),
}

CI = Tuple[float, float]


@dataclass(frozen=True, eq=False)
class DomainComparison(Result):
    """The geometry of one model on several prompt domains (METHODS.md §5).

    ``pc1_diff``, ``pc12_diff`` and ``pr_diff`` map each domain to an :class:`~bayes_lens.Estimate`
    of its difference to the reference domain (``ci`` from independent bootstraps of both domains'
    prompts, ``null`` 0; the reference's own entry is 0 with interval ``(0, 0)``).
    """

    domains: Tuple[str, ...]
    reference: str
    layer: int
    site: str
    n: int
    seed: int
    model_name: str
    selections: Dict[str, object]          # domain -> bayes_lens.prompts.Selection
    value_manifold: Dict[str, object]      # domain -> bayes_lens.ValueManifold
    attention_focusing: Dict[str, object]  # domain -> AttentionFocusing
    entropy_alignment: Dict[str, object]   # domain -> EntropyAlignment
    key_orthogonality: object              # KeyOrthogonality (weights only: the same for every domain)
    # domain -> difference to the reference domain of PC1, PC1+PC2, participation ratio (dims)
    pc1_diff: Dict[str, Estimate]
    pc12_diff: Dict[str, Estimate]
    pr_diff: Dict[str, Estimate]
    ci_method: str = "recentered"
    n_boot: int = 1000

    def collapses(self, domain: str) -> bool:
        """True when ``domain``'s PC1+PC2 is above the reference's with a CI that excludes 0."""
        if domain not in self.pc12_diff:
            raise InvalidInputError(f"unknown domain {domain!r}; this comparison has {list(self.domains)}.")
        lo = self.pc12_diff[domain].ci_low
        return bool(np.isfinite(lo) and lo > 0)

    def _summary(self):
        title = (f"{len(self.domains)} domains vs {self.reference!r}, layer {self.layer} {self.site!r}, "
                 f"n = {self.n} prompts each")
        rows = []
        for d in self.domains:
            vm = self.value_manifold[d]
            if d == self.reference:
                rows.append((f"{d} (reference) PC1+PC2", fmt_pct(vm.pc12), fmt_ci(vm.pc12, pct=True),
                             f"PR {fmt(vm.participation_ratio)}"))
            else:
                rows.append((f"{d} PC1+PC2", fmt_pct(vm.pc12), fmt_ci(vm.pc12, pct=True),
                             f"minus reference {fmt_pct(self.pc12_diff[d])} {fmt_ci(self.pc12_diff[d], pct=True)}"))
        return title, rows

    def to_dataframe(self):
        """One row per domain: PC1, PC1+PC2, PR (CIs, Gaussian null), alignment ρ, focusing, diffs."""
        import pandas as pd

        rows = []
        for d in self.domains:
            vm, af, ea, sel = (self.value_manifold[d], self.attention_focusing[d], self.entropy_alignment[d],
                               self.selections[d])
            rows.append({
                "domain": d,
                "n_prompts": vm.n_prompts,
                "pool_size": len(sel.pool_entropy_bits),
                "layer": vm.layer,
                "site": vm.site,
                "mean_entropy_bits": float(np.mean(sel.entropy_bits)),
                "pc1_fraction": vm.pc1.value, "pc1_ci_low": vm.pc1.ci_low, "pc1_ci_high": vm.pc1.ci_high,
                "null_pc1_fraction": vm.pc1.null,
                "pc12_fraction": vm.pc12.value, "pc12_ci_low": vm.pc12.ci_low, "pc12_ci_high": vm.pc12.ci_high,
                "null_pc12_fraction": vm.pc12.null, "null_pc12_high": vm.pc12.null_interval[1],
                "participation_ratio_dims": vm.participation_ratio.value,
                "participation_ratio_ci_low": vm.participation_ratio.ci_low,
                "participation_ratio_ci_high": vm.participation_ratio.ci_high,
                "null_participation_ratio_dims": vm.participation_ratio.null,
                "alignment_spearman_rho": ea.spearman.value, "alignment_ci_low": ea.spearman.ci_low,
                "alignment_ci_high": ea.spearman.ci_high, "alignment_abs_rho": ea.abs_spearman,
                "alignment_pvalue": ea.spearman_pvalue,
                "focusing_reduction_fraction": af.reduction.value, "focusing_ci_low": af.reduction.ci_low,
                "focusing_ci_high": af.reduction.ci_high,
                "pc1_diff_vs_reference": self.pc1_diff[d].value,
                "pc1_diff_ci_low": self.pc1_diff[d].ci_low, "pc1_diff_ci_high": self.pc1_diff[d].ci_high,
                "pc12_diff_vs_reference": self.pc12_diff[d].value,
                "pc12_diff_ci_low": self.pc12_diff[d].ci_low, "pc12_diff_ci_high": self.pc12_diff[d].ci_high,
                "participation_ratio_diff_vs_reference": self.pr_diff[d].value,
                "participation_ratio_diff_ci_low": self.pr_diff[d].ci_low,
                "participation_ratio_diff_ci_high": self.pr_diff[d].ci_high,
                "reference": self.reference,
            })
        return pd.DataFrame(rows)

    def plot(self):
        """Side-by-side bars per domain: PC1, PC1+PC2 (with the Gaussian null), PR, |ρ|, focusing."""
        go = plotly()
        from plotly.subplots import make_subplots

        df = self.to_dataframe()
        # (title with its units, column, CI low, CI high, null column, tick format). The units are in the
        # panel titles, not in y-axis titles: five rotated axis titles between five panels ran into the
        # neighbouring panel's tick labels
        panels = [
            ("PC1<br>(% of variance)", "pc1_fraction", "pc1_ci_low", "pc1_ci_high", "null_pc1_fraction", ".0%"),
            ("PC1+PC2<br>(% of variance)", "pc12_fraction", "pc12_ci_low", "pc12_ci_high", "null_pc12_fraction",
             ".0%"),
            ("participation ratio<br>(effective dims)", "participation_ratio_dims", "participation_ratio_ci_low",
             "participation_ratio_ci_high", "null_participation_ratio_dims", None),
            ("alignment ρ(PC1, H)<br>(Spearman; sign arbitrary)", "alignment_spearman_rho", "alignment_ci_low",
             "alignment_ci_high", None, None),
            ("attention focusing<br>(entropy reduction)", "focusing_reduction_fraction", "focusing_ci_low",
             "focusing_ci_high", None, ".0%"),
        ]
        bar, null_color = "#4c72b0", "#d62728"  # the null markers share one colour, the legend's
        fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels],
                            horizontal_spacing=0.06)
        fig.update_annotations(font_size=12)  # the subplot titles
        for j, (title, col, lo, hi, null, fmt) in enumerate(panels, start=1):
            y = df[col].to_numpy(float)
            fig.add_trace(go.Bar(x=df["domain"], y=y, name=title.split("<br>")[0], showlegend=False, marker_color=bar,
                                 error_y=dict(type="data", symmetric=False, array=df[hi].to_numpy(float) - y,
                                              arrayminus=y - df[lo].to_numpy(float))), row=1, col=j)
            if null is not None:
                fig.add_trace(go.Scatter(x=df["domain"], y=df[null], mode="markers", marker_symbol="line-ew-open",
                                         marker=dict(size=18, color=null_color, line=dict(width=3, color=null_color)),
                                         name="Gaussian null (same n × d)", legendgroup="null",
                                         showlegend=j == 1), row=1, col=j)
            fig.update_yaxes(tickformat=fmt, row=1, col=j)
        fig.update_layout(title=f"Geometry by domain ({self.model_name}, layer {self.layer}, n = {self.n} each; "
                                f"bars: 95% bootstrap CI)",
                          legend=dict(orientation="h", x=0, xanchor="left", y=-0.15, yanchor="top"),
                          margin=dict(t=110))
        return fig


def _domain_specs(domains) -> Dict[str, object]:
    """``{label: pool}`` from a sequence of pool names or a mapping label -> pool (name or list)."""
    from .prompts import POOLS

    if isinstance(domains, str):
        raise InvalidInputError("domains must be a sequence of pool names (e.g. ('mixed', 'math')) or a mapping "
                                "{label: pool}, not one string.")
    if isinstance(domains, Mapping):
        specs = {str(k): v for k, v in domains.items()}
    else:
        specs = {}
        for d in domains:
            if not isinstance(d, str) or d not in POOLS:
                raise InvalidInputError(
                    f"unknown domain {d!r}; the shipped pools are {list(POOLS)}. For your own prompts pass a "
                    "mapping, e.g. domains={'mixed': 'mixed', 'legal': [...your prompts...]}."
                )
            if d in specs:
                raise InvalidInputError(f"domain {d!r} is listed twice.")
            specs[d] = d
    if len(specs) < 1:
        raise InvalidInputError("domains is empty; pass at least one domain.")
    return specs


def _diff_ci(boot_d: np.ndarray, boot_r: np.ndarray, est: float, ci_method: str) -> CI:
    """Interval of a domain difference from independent bootstraps, by the value manifold's method."""
    from .metrics.pca import pca_bootstrap_cis

    (ci,), _ = pca_bootstrap_cis((boot_d - boot_r)[:, None], (est,), ci_method)
    return ci


def _pr_diff_caveat(vm, vm_ref, ci_method: str) -> str:
    """What the participation-ratio difference's interval covers: the population difference only when
    both domains' own PR intervals do (:func:`bayes_lens.metrics.pca.pr_interval_covers_population`);
    otherwise the same-n difference. Sample PR is biased low by about PR²/(n + PR) in each domain
    (E[PR̂] ≈ PR/(1 + PR/n)), so a difference of two PRs of different size inherits a bias a
    resample does not see: in simulation the interval covered the population difference in 0 of 60
    data sets at n = 40 (population −101.9, the same-n statistic −10.1)."""
    from .metrics.pca import pr_interval_covers_population

    parts = []
    for v in (vm, vm_ref):
        pr = v.participation_ratio.value
        d = v.dim - v.n_constant_dims
        if not pr_interval_covers_population(v.n_prompts, d, ci_method, pr):
            parts.append(f"n = {v.n_prompts}, sample PR {pr:.1f}, d = {d}")
    if not parts:
        return "; approximately covers the population PR difference (both domains' PR intervals do)"
    return ("; describes the same-n difference only, does not cover the population PR difference "
            "(sample PR is biased low by ≈ PR²/n per domain; " + "; ".join(parts) + ")")


def compare_domains(model, domains: Union[Sequence[str], Mapping[str, object]] = ("mixed", "math", "code", "philosophy"),
                    n_prompts: int = 75, *, seed: int = 0, reference: Optional[str] = None, layer: int = -1, site: str = "v",
                    positions: str = "last", n_boot: int = 1000, n_null: int = 200, n_perm: int = 1000,
                    ci_method: str = "recentered", balance_kinds: Optional[bool] = None, batch_size: int = 16,
                    progress: Optional[bool] = None, pool_size: Optional[int] = DEFAULT_POOL_SIZE) -> DomainComparison:
    """Entropy-stratified prompts per domain, the geometry of each, and differences to ``reference``.

    ``domains``: pool names (:data:`bayes_lens.prompts.POOLS`) or a mapping ``{label: pool}`` where a
    pool is a name or a list of strings/records. ``reference`` defaults to ``"mixed"`` when present,
    else the first domain. ``n_prompts`` prompts per domain (``n_prompts // 5`` per entropy quintile, see
    :func:`bayes_lens.prompts.select`), drawn with ``seed``; the statistics use the same ``seed``.
    ``balance_kinds=None`` balances kinds for the mixed pool only.

    Cost: every candidate of a pool is scored by one forward pass. ``pool_size`` (default
    :data:`DEFAULT_POOL_SIZE` = 150) scores a seeded subsample of each shipped pool (the first
    ``pool_size`` of a seeded permutation, so the mixed candidates are also among those that
    ``bl.prompts.mixed(model, seed=seed)`` scored, and come from its cache). About 0.1 s per
    candidate on SmolLM2-135M on 2 quiet CPU cores: ``compare_domains(model)`` about 1-1.5 min,
    ``compare_domains(model, ("mixed", "math"), n_prompts=40)`` about 20-30 s; ``pool_size=None`` scores the
    whole pools (1,100 + 3 × 240 candidates: about 3-4 min), as Paper A does.
    """
    from .collect import collect
    from ._geometry import CI_METHODS, attention_focusing, entropy_alignment, key_orthogonality, value_manifold
    from .metrics.pca import CI_METHOD_LABELS, bootstrap_pca_stats
    from .metrics.stats import as_numpy
    from .prompts import select

    specs = _domain_specs(domains)
    if reference is None:
        reference = "mixed" if "mixed" in specs else next(iter(specs))
    if reference not in specs:
        raise InvalidInputError(f"reference {reference!r} is not one of the domains {list(specs)}.")
    check_choice(ci_method, "ci_method", CI_METHODS)
    check_choice(site, "site", ("v", "resid_post"))
    layer = adapter.resolve_layer(model, layer)
    info = adapter.model_info(model)

    sels, vms, afs, eas, xs = {}, {}, {}, {}, {}
    for label, pool in specs.items():
        bk = balance_kinds if balance_kinds is not None else (isinstance(pool, str) and pool == "mixed")
        sel = select(model, pool, n_prompts, seed=seed, balance_kinds=bk, batch_size=batch_size, progress=progress,
                     pool_size=pool_size)
        col = collect(model, list(sel.prompts), desc=f"compare_domains: {label}", value_layers=[layer] if site == "v" else (),
                      resid_layers=[layer] if site != "v" else (), attention=True, attention_positions=positions,
                      batch_size=batch_size, progress=progress)
        sels[label] = sel
        vms[label] = value_manifold(col, layer=layer, site=site, seed=seed, n_boot=n_boot, n_null=n_null,
                                    ci_method=ci_method)
        afs[label] = attention_focusing(col, positions=positions, seed=seed, n_boot=n_boot)
        eas[label] = entropy_alignment(col, layer=layer, site=site, seed=seed, n_boot=n_boot, n_perm=n_perm)
        xs[label] = as_numpy(col.value_rows(layer, site))
    keys = key_orthogonality(model, seed=seed)

    # differences to the reference: independent resamples of each domain's prompts
    # (each domain's resampling seed depends on its label, not on its position in ``domains``)
    boots = {label: bootstrap_pca_stats(x, n_boot=n_boot, seed=seed + 1 + zlib.crc32(label.encode()))
             for label, x in xs.items()}
    method = (f"95% {CI_METHOD_LABELS[ci_method]} of the difference; independent bootstraps of each domain's "
              "prompts")
    diffs = {k: {} for k in ("pc1", "pc12", "pr")}
    for label in specs:
        for j, (key, attr) in enumerate((("pc1", "pc1"), ("pc12", "pc12"), ("pr", "participation_ratio"))):
            est = float(getattr(vms[label], attr).value - getattr(vms[reference], attr).value)
            ci = ((0.0, 0.0) if label == reference else
                  _diff_ci(boots[label][:, j], boots[reference][:, j], est, ci_method))
            label_j = method if key != "pr" else method + _pr_diff_caveat(vms[label], vms[reference], ci_method)
            diffs[key][label] = Estimate(est, ci, label_j, null=0.0, n=vms[label].n_prompts)
    return DomainComparison(
        domains=tuple(specs), reference=reference, layer=layer, site=site, n=int(n_prompts), seed=int(seed),
        model_name=info.name, selections=sels, value_manifold=vms, attention_focusing=afs, entropy_alignment=eas,
        key_orthogonality=keys, pc1_diff=diffs["pc1"], pc12_diff=diffs["pc12"], pr_diff=diffs["pr"],
        ci_method=ci_method,
        n_boot=n_boot,
    )
