"""The confidence mechanism: entropy neurons, the unembedding's null space and the final norm's temperature.

METHODS.md §15; Stolfo, Wu, Gurnee, Belinkov, Song, Sachan, Nanda, "Confidence Regulation Neurons in Language
Models" (NeurIPS 2024, arXiv 2406.16254). ``bl.confidence(model, items)`` asks whether the model's entropy is
set by the known confidence channel - final-layer MLP neurons that write into the unembedding's near-null
space, so that they change the residual's norm and the final norm turns it into a temperature - and whether
the library's own entropy axis (§7, §13) is that channel.

Maths. x is the residual at the final norm's input (final real token), s(x) its scale (RMS + ε, or the
standard deviation for a LayerNorm), g the gain, C the centring of a LayerNorm (I for an RMSNorm); the logits
are A·x / s(x) + b with A = W_Uᵀ·diag(g)·C ``[V, d]`` (:func:`bayes_lens.adapter.final_norm`). Neuron j of
the MLP at ``layer`` writes a_j·w_j (w_j row j of W_out). The screen, per neuron:

* ‖w_j‖;
* LogitVar_j = Var_v cos(w_j, A_v) (the variance over the vocabulary of the cosine with each token's read
  direction A_v = C·diag(g)·W_U[:, v]; population variance);
* ρ_k(j) = ‖P_k w_j‖² / ‖w_j‖², P_k the projector on the bottom-k right singular vectors of A (k = max(1,
  round(k_fraction·d)); for a LayerNorm inside 1^⊥, the constant direction being removed by C);
* the token-frequency cosine cos(A w_j − mean, log p_u − mean), p_u an offline unigram *proxy*: the model's
  next-token distribution after its boundary token (BOS or EOS), labelled as such;
* random-direction bands: ρ_k of a Haar direction is Beta(k/2, (d − k)/2) (exact); LogitVar's and the
  frequency cosine's bands are simulated from ``n_random`` Haar directions; ‖w‖'s from a Gaussian column with
  the layer's entry variance (σ·χ_d).

A neuron is *null-space* when ρ_k exceeds the Beta quantile 1 − α/d_mlp (Bonferroni: a family-wise false
positive rate ≤ α over the layer for Haar directions, measured in tests/test_confidence.py). Effects: neuron j
mean-ablated at the final token (``op="mean"``, basis e_j, source its mean final-token activation) changes,
per prompt, the next-token entropy H (bits), the loss −log p(next token) (nats; for task items the drawn
outcome's answer, for plain text its own last token, split off), the top-1 token (agreement with clean) and,
for task items, the answer posterior (total variation to clean) and the calibration |H(answers) − H_Bayes|
(bits). *Total*: the plain ablation. *Direct*: the same with the final norm's scale frozen at its clean value
(a swap of ``ln_final.hook_scale`` to the clean value, at the final token; the hook exists and is editable on
the HookedTransformer and on both bridges, TL 3.9 and 4.3). *Norm-mediated* = total − direct, per prompt.
Intervals: paired percentile bootstrap over prompts (within k for task items). Band: the same effects of
``n_random_neurons`` random neurons of the layer. **Entropy neuron** (the rule): null-space, and the
norm-mediated ΔH's interval excludes 0 with |ΔH_mediated| above the random-neuron band's upper end and
``min_effect_bits``, and |ΔH_direct| < |ΔH_mediated|.

The axis: the ridge (or PC1) axis u of the final-token ``resid_post`` rows of ``axis_layer`` onto the model's
entropy (fitted on all prompts, in sample); its overlap with the null space ‖P_k u‖² (TransformerLens 4.3's
``projection_kernel`` where present, numpy otherwise; Haar null Beta(k/2, (d − k)/2)); |cos(u, w_j)| with the
top null-space neurons; and its removal (``op="remove"``) total vs frozen-scale: the norm-mediated share
S = Σ_i|m_i| / Σ_i(|m_i| + |d_i|) (m_i = ΔH_total − ΔH_direct, d_i = ΔH_direct of prompt i; magnitudes, so
effects of opposite sign on different prompts do not cancel) with a bootstrap interval (ratio of means),
beside random directions'.
The answer to "is this axis the norm-temperature channel?": *yes* when its overlap lies above the Haar
band's 97.5% point and the share's interval lies above 0.5; *no* when the share's interval lies below 0.5;
*undecided* otherwise (and when the removal changes no prompt's entropy). For a Haar direction the overlap
condition alone fires in 2.5% of draws, which bounds the rule's false "yes" rate (measured in the tests).

Gemma: the (1 + w) gain is read (:func:`bayes_lens.adapter.final_norm`) and the final logit soft-cap acts on
the model's own logits in both paths (the direct path freezes the scale only).
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import adapter
from ._results import Estimate, Result, fmt, fmt_ci, plotly
from ._validate import check_choice, check_count, check_float, check_int, check_seed
from .collect import StreamKeeper, collect
from .errors import InvalidInputError
from .hooks import final_rows
from .interventions import Intervention, haar_draw
from .metrics.stats import bootstrap_indices, percentile_interval
from .reads import BoundRead, NextTokenEntropy, Read, TokenLogprobs

__all__ = ["confidence", "Confidence", "screen_neurons", "NeuronScreen", "null_space", "null_space_overlap", "AXIS_RULE", "NEURON_RULE"]

NEURON_RULE = ("entropy neuron: ρ_k above the Haar Beta(k/2, (d−k)/2) quantile 1 − α/d_mlp (null-space), the "
               "norm-mediated ΔH's 95% interval excluding 0 with |ΔH_mediated| above the random-neuron band's upper "
               "end and min_effect_bits, and |ΔH_direct| < |ΔH_mediated|")
AXIS_RULE = ("yes when the axis's null-space overlap lies above the Haar band's 97.5% point and the norm-mediated "
             "share's 95% interval lies above 0.5; no when that interval lies below 0.5; undecided otherwise")
_SCALE_WARNING = "A forward hook edited hook_scale"
_PROXY = "unigram proxy: the model's next-token distribution after its boundary token {tok!r} (not corpus counts)"


# ----------------------------------------------------------------------------------------------- reads
@dataclass(frozen=True)
class _SiteAtFinal(Read):
    """The final-real-token row of one hook point (``hook``), kept as ``key`` (float32 ``[n, width]``)."""

    hook: str
    key: str

    def bind(self, model) -> BoundRead:
        return _BoundSiteAtFinal(self, model)


class _BoundSiteAtFinal(BoundRead):
    def __init__(self, read, model):
        super().__init__(read, model)
        self.hook_names = (read.hook,)

    def hooks(self, batch):
        def fn(act, hook=None):
            self.keep(self.read.key, final_rows(act, batch.attention_mask, what=self.read.hook, indices=batch.indices))
        return [(self.read.hook, fn)]


@dataclass(frozen=True)
class _FinalTop(Read):
    """The top-1 token at the final real token (``top1`` ``[n]``) and, with ``full``, every log-probability
    (``final_logprobs`` ``[n, vocab]``, float64)."""

    full: bool = False
    logits = "final"

    def bind(self, model) -> BoundRead:
        return _BoundFinalTop(self, model)


class _BoundFinalTop(BoundRead):
    def after_pass(self, batch, final_logits):
        self.keep("top1", final_logits.argmax(-1).cpu())
        if self.read.full:
            self.keep("final_logprobs", torch.log_softmax(final_logits.double(), -1).cpu())


# ----------------------------------------------------------------------------------------------- the screen
def _centring_basis(d: int, centred: bool) -> np.ndarray:
    """Orthonormal basis ``[d, d']`` of the space the norm sees: 1^⊥ for a LayerNorm (d' = d − 1), else I."""
    if not centred:
        return np.eye(d)
    q = np.linalg.qr(np.concatenate([np.ones((d, 1)), np.eye(d)[:, : d - 1]], 1))[0]
    return q[:, 1:]


def null_space(model, k: Optional[int] = None, *, k_fraction: float = 0.01):
    """``(N, A, Q)``: N ``[d, k]`` the bottom-k right singular vectors of the frozen-scale unembedding A = W_Uᵀ·diag(g)·C
    (within Q's span: 1^⊥ for a LayerNorm), A ``[V, d]`` and Q ``[d, d']`` (module docstring). ``k`` None:
    max(1, round(k_fraction·d)).

    The SVD of the ``[V, d]`` matrix takes about a minute on Gemma's 262k tokens, so the result is kept per model
    (weakly: it goes with the model) and per k, and reused while the unembedding and the gain are byte for byte
    the same (a BLAKE2 digest of each, compared on every call: ~1 s on Gemma; editing the weights recomputes it).
    ``bl.confidence`` and ``bl.screen_neurons`` on one model share one SVD this way."""
    norm = adapter.final_norm(model)
    wu = adapter.unembedding(model)                       # [d, V]
    d = wu.shape[0]
    q = _centring_basis(d, norm.centred)
    k = max(1, int(round(check_float(k_fraction, "k_fraction", min=0.0, max=1.0) * d))) if k is None else \
        check_int(k, "k", min=1, max=q.shape[1] - 1)
    gain = np.asarray(norm.gain, dtype=np.float64)
    stamp = (bool(norm.centred), wu.shape, _digest(wu), _digest(gain))
    try:
        kept = _NULL_SPACES.setdefault(model, {})
    except TypeError:                                     # an object without weak references: no reuse
        kept = {}
    hit = kept.get(k)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    a = (wu * norm.gain[:, None]).T @ (q @ q.T)           # [V, d]: C = QQᵀ
    _, _, vt = np.linalg.svd(a @ q, full_matrices=False)  # right singular vectors in Q's coordinates
    out = (q @ vt[-k:].T, a, q)
    kept[k] = (stamp, out)
    return out


_NULL_SPACES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _digest(x: np.ndarray) -> str:
    x = np.ascontiguousarray(x)
    return f"{x.dtype}:{hashlib.blake2b(memoryview(x).cast('B'), digest_size=16).hexdigest()}"


def _logit_var(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Var_v cos(w_i, A_v) for each row w_i of ``w`` ``[m, d]`` (chunks, so V·m never sits in memory at once)."""
    an = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-300)
    out = np.empty(w.shape[0])
    step = max(1, int(2e7 // max(1, a.shape[0])))
    for s in range(0, w.shape[0], step):
        ww = w[s:s + step]
        c = (ww / np.maximum(np.linalg.norm(ww, axis=1, keepdims=True), 1e-300)) @ an.T
        out[s:s + step] = c.var(axis=1)
    return out


def _freq_cos(w: np.ndarray, a: np.ndarray, log_pu: Optional[np.ndarray]) -> np.ndarray:
    if log_pu is None:
        return np.full(w.shape[0], np.nan)
    f = log_pu - log_pu.mean()
    f = f / max(np.linalg.norm(f), 1e-300)
    out = np.empty(w.shape[0])
    step = max(1, int(2e7 // max(1, a.shape[0])))        # chunks: V·m never sits in memory at once
    for s in range(0, w.shape[0], step):
        eff = w[s:s + step] @ a.T                         # [m, V]: what each direction adds to the logits
        eff = eff - eff.mean(1, keepdims=True)
        out[s:s + step] = (eff @ f) / np.maximum(np.linalg.norm(eff, axis=1), 1e-300)
    return out


@dataclass(frozen=True, eq=False)
class NeuronScreen(Result):
    """The weight screen of one MLP layer (module docstring): ``table`` one row per neuron (``neuron``,
    ``out_norm``, ``logit_var``, ``null_fraction`` ρ_k, ``null_norm`` ‖P_k w‖, ``freq_cos``, ``null_space``,
    ``frequency`` flags, ``rank`` by ``null_norm``), ``bands`` one row per figure (Haar / Gaussian null mean,
    2.5% and 97.5% points, the flag threshold), ``k``, ``d`` (the dimension the norm sees), ``alpha``."""

    layer: int
    k: int
    d: int
    alpha: float
    table: object
    bands: object
    unigram_proxy: str

    def to_dataframe(self):
        """Long format: ``layer, neuron, metric, value`` (metrics ``out_norm``, ``logit_var``, ``null_fraction``, ...)."""
        t = self.table
        long = t.melt(id_vars=["neuron"], value_vars=["out_norm", "logit_var", "null_fraction", "null_norm",
                                                      "freq_cos"], var_name="metric", value_name="value")
        long.insert(0, "layer", self.layer)
        return long

    def top(self, n: int = 5) -> List[int]:
        """The ``n`` neurons writing most into the null space (largest ‖P_k w‖)."""
        return [int(j) for j in self.table.sort_values("null_norm", ascending=False)["neuron"].head(n)]

    def plot(self):
        """ρ_k against ‖w_out‖, one point per neuron (colour: LogitVar), the Haar flag threshold as a line."""
        go = plotly()
        t = self.table
        fig = go.Figure(go.Scatter(x=t["out_norm"], y=t["null_fraction"], mode="markers", text=t["neuron"],
                                   marker=dict(color=t["logit_var"], colorbar=dict(title="LogitVar"))))
        thr = float(self.bands.set_index("metric").loc["null_fraction", "flag_threshold"])
        fig.add_hline(y=thr, line_dash="dash", annotation_text="Haar 1 − α/d_mlp")
        fig.update_layout(title=f"Layer {self.layer} neurons: null-space fraction ρ_{self.k} vs ‖w_out‖",
                          xaxis_title="‖w_out‖", yaxis_title=f"ρ_{self.k}")
        return fig

    def _summary(self):
        t = self.table
        rows = [("neurons", str(len(t)), "", f"k = {self.k} of d = {self.d}"),
                ("null-space neurons", str(int(t["null_space"].sum())), "", f"ρ_k above Haar 1 − {self.alpha}/d_mlp"),
                ("top by ‖P_k w‖", ", ".join(str(j) for j in self.top(3)), "", "")]
        return f"layer {self.layer} neuron screen", rows


def screen_neurons(model, layer: int = -1, *, k: Optional[int] = None, k_fraction: float = 0.01,
                   n_random: int = 200, alpha: float = 0.05, log_unigram=None, unigram_proxy: str = "",
                   seed: int = 0) -> NeuronScreen:
    """The weight screen of ``layer``'s MLP neurons (module docstring); no forward pass (``log_unigram``
    ``[V]``: the unigram proxy's log-probabilities, for the token-frequency cosine; None: not computed).

    >>> import bayes_lens as bl
    >>> model, planted = bl.models.tiny.confidence_model("bridge")
    >>> bl.screen_neurons(model).top(1) == [planted.entropy_neuron]
    True
    """
    import pandas as pd
    from scipy import stats as st

    layer = adapter.resolve_layer(model, layer)
    n_random = check_count(n_random, "n_random")
    alpha = check_float(alpha, "alpha", min=0.0, max=1.0, min_inclusive=False, max_inclusive=False)
    seed = check_seed(seed)
    nb, a, q = null_space(model, k, k_fraction=k_fraction)   # kept per model: confidence() reuses this SVD
    k = nb.shape[1]
    w = adapter.mlp_out_weights(model, layer) @ (q @ q.T)         # what the norm sees of each w_out
    dq = q.shape[1]
    norms = np.linalg.norm(w, axis=1)
    rho = ((w @ nb) ** 2).sum(1) / np.maximum(norms ** 2, 1e-300)
    lpu = None if log_unigram is None else np.asarray(log_unigram, dtype=np.float64).ravel()
    if lpu is not None and lpu.shape[0] != a.shape[0]:
        raise InvalidInputError(f"log_unigram has {lpu.shape[0]} entries but the vocabulary has {a.shape[0]}.")
    fc = _freq_cos(w, a, lpu)
    lv = _logit_var(w, a)
    rng = np.random.default_rng(seed)
    rand = rng.standard_normal((n_random, dq)) @ q.T                # Haar directions in the norm's space
    r_lv, r_fc = _logit_var(rand, a), _freq_cos(rand, a, lpu)
    n = w.shape[0]
    rho_thr = float(st.beta.ppf(1 - alpha / n, k / 2, (dq - k) / 2))
    sigma = float(np.sqrt(np.mean(w ** 2)))
    chi = lambda p: sigma * math.sqrt(st.chi2.ppf(p, dq))  # noqa: E731
    if lpu is not None:
        z = st.norm.ppf(1 - alpha / (2 * n))
        fc_thr = float(np.abs(r_fc.mean()) + z * r_fc.std(ddof=1))
    else:
        fc_thr = float("nan")
    bands = pd.DataFrame([
        dict(metric="out_norm", null="Gaussian column with the layer's entry variance (σ·χ_d)", null_mean=sigma * math.sqrt(dq),
             null_low=chi(0.025), null_high=chi(0.975), flag_threshold=float("nan")),
        dict(metric="logit_var", null=f"{n_random} Haar directions", null_mean=float(r_lv.mean()),
             null_low=float(np.quantile(r_lv, 0.025)), null_high=float(np.quantile(r_lv, 0.975)),
             flag_threshold=float("nan")),
        dict(metric="null_fraction", null=f"Haar direction: Beta({k}/2, {dq - k}/2), exact", null_mean=k / dq,
             null_low=float(st.beta.ppf(0.025, k / 2, (dq - k) / 2)), null_high=float(st.beta.ppf(0.975, k / 2, (dq - k) / 2)),
             flag_threshold=rho_thr),
        dict(metric="freq_cos", null=f"{n_random} Haar directions (normal fit for the flag)", null_mean=float(np.nanmean(r_fc)) if lpu is not None else float("nan"),
             null_low=float(np.quantile(r_fc, 0.025)) if lpu is not None else float("nan"),
             null_high=float(np.quantile(r_fc, 0.975)) if lpu is not None else float("nan"), flag_threshold=fc_thr),
    ])
    nn = norms * np.sqrt(rho)
    table = pd.DataFrame(dict(neuron=np.arange(n), out_norm=norms, logit_var=lv, null_fraction=rho, null_norm=nn,
                              freq_cos=fc, null_space=rho > rho_thr,
                              frequency=np.abs(fc) > fc_thr if lpu is not None else np.zeros(n, bool)))
    table["rank"] = table["null_norm"].rank(ascending=False, method="first").astype(int)
    return NeuronScreen(layer=layer, k=k, d=dq, alpha=alpha, table=table, bands=bands, unigram_proxy=unigram_proxy)


# ----------------------------------------------------------------------------------------------- the runs
def _prepare(model, items):
    """``(texts, answer_ids | None, exact posterior | None, strata | None, target ids [n], task name)``."""
    from .tasks import answer_token_ids, as_task_prompts, get_tokenizer, is_task_item

    if items is None:
        from .sula import make_prompts

        items = make_prompts(model, n_per_k=12, seed=0)
    if isinstance(items, str):
        items = [items]
    items = list(items) if not hasattr(items, "texts") else items
    if len(items) and all(is_task_item(it) for it in items):
        tp = as_task_prompts(items)
        ids = list(answer_token_ids(model, tp.answers))
        out = tp.outcome
        target = np.array([ids[o] if o >= 0 else -1 for o in out], dtype=np.int64)
        return list(tp.texts), ids, tp.posterior, np.asarray(tp.k), target, tp.task
    tok = get_tokenizer(model)
    texts, target = [], []
    for t in items:
        if not isinstance(t, str):
            raise InvalidInputError(f"items must be task items or strings, got {type(t).__name__}.")
        ids = list(tok(t, add_special_tokens=False)["input_ids"])
        if len(ids) < 2:
            continue
        head = tok.decode(ids[:-1])
        if list(tok(head, add_special_tokens=False)["input_ids"]) == ids[:-1]:  # the split round-trips
            texts.append(head)
            target.append(ids[-1])
    if len(texts) < 4:
        raise InvalidInputError(f"only {len(texts)} of the {len(items)} texts split into a prompt and a last token "
                                "that re-tokenize the same; pass at least 4 such texts (or task items).")
    return texts, None, None, None, np.asarray(target, dtype=np.int64), "text"


class _Runner:
    """One clean pass (keeping the means, the scale and the stream), then conditions as intervention lists."""

    def __init__(self, model, texts, answer_ids, target, *, layer, axis_layer, batch_size, progress):
        self.model, self.texts, self.layer = model, texts, layer
        self.ids = sorted({int(t) for t in target if t >= 0} | set(answer_ids or ()))
        self.col = {t: i for i, t in enumerate(self.ids)}
        self.kw = dict(batch_size=batch_size, progress=progress)
        self.n_layers = adapter.model_info(model).n_layers
        self.post = adapter.hook_name(model, layer, "mlp_post")
        self.scale = adapter.SITES["final_scale"]
        reads = [NextTokenEntropy(), TokenLogprobs(tuple(self.ids)), _FinalTop(),
                 _SiteAtFinal(self.post, "mlp_post"), _SiteAtFinal(self.scale, "final_scale")]
        from .reads import FinalRows

        reads.append(FinalRows(axis_layer, "resid_post"))
        keep_at = layer - 1
        keeper = StreamKeeper(model, [keep_at]) if keep_at >= 0 else None
        rc = collect(model, texts, reads=reads, fwd_hooks=keeper if keeper is not None else (),
                     desc=f"confidence: clean pass, {len(texts)} prompts", **self.kw)
        self.clean = self._arrays(rc)
        self.mlp_rows = rc["mlp_post"].double().numpy()
        self.scale_rows = rc["final_scale"].double().numpy()
        self.resid_rows = rc.value_rows(axis_layer, "resid_post").double().numpy()
        self.resume = None
        if keeper is not None:
            kept = keeper.stream(keep_at, len(texts))
            if kept is not None and kept.check(self.ids, rc["token_logprobs"].double().numpy()) is None:
                self.resume, self.resume_layer = kept, keep_at
        self.passes = 1

    @staticmethod
    def _arrays(rc) -> Dict[str, np.ndarray]:
        return {"H": rc["next_token_entropy"].double().numpy(), "lp": rc["token_logprobs"].double().numpy(),
                "top1": rc["top1"].numpy()}

    def freeze(self) -> Intervention:
        return Intervention(layer=self.n_layers - 1, site="final_scale", basis=np.ones((1, 1)), op="swap",
                            positions="final", source=self.scale_rows.astype(np.float32), label="final scale frozen")

    def run(self, ivs: Sequence[Intervention], desc: str) -> Dict[str, np.ndarray]:
        ivs = list(ivs)
        resume = self.resume if self.resume is not None and all(iv.layer > self.resume_layer for iv in ivs) else None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SCALE_WARNING)
            rc = collect(self.model, self.texts, reads=[NextTokenEntropy(), TokenLogprobs(tuple(self.ids)), _FinalTop()],
                         interventions=ivs, resume=resume, desc=desc, **self.kw)
        self.passes += 1
        return self._arrays(rc)

    def pair(self, ivs: Sequence[Intervention], desc: str):
        """``(total, direct)`` arrays for ``ivs`` alone and with the final scale frozen."""
        return self.run(ivs, desc + " (total)"), self.run(list(ivs) + [self.freeze()], desc + " (direct)")


def _per_prompt(clean, cond, target_col, answer_cols, post_exact) -> Dict[str, np.ndarray]:
    """Per-prompt changes of ``cond`` against ``clean``: ΔH bits, Δloss nats, top-1 agreement, and for tasks the
    answer posterior's total variation and Δ|H(answers) − H_Bayes| bits."""
    out = {"d_entropy_bits": cond["H"] - clean["H"], "top1_agreement": (cond["top1"] == clean["top1"]).astype(float)}
    rows = np.arange(len(target_col))
    ok = target_col >= 0
    loss = np.where(ok, -cond["lp"][rows, np.maximum(target_col, 0)], np.nan)
    loss0 = np.where(ok, -clean["lp"][rows, np.maximum(target_col, 0)], np.nan)
    out["d_loss_nats"] = loss - loss0
    if answer_cols is not None:
        from .metrics.stats import entropy_bits
        from .tasks import answer_posterior

        q0, _ = answer_posterior(clean["lp"][:, answer_cols])
        q1, _ = answer_posterior(cond["lp"][:, answer_cols])
        hb = entropy_bits(post_exact)
        out["posterior_tv"] = 0.5 * np.abs(q1 - q0).sum(1)
        out["d_mae_bits"] = np.abs(entropy_bits(q1) - hb) - np.abs(entropy_bits(q0) - hb)
    return out


_MEDIATED = ("d_entropy_bits", "d_loss_nats", "d_mae_bits")


def _estimate(x: np.ndarray, boots: np.ndarray, method: str) -> Estimate:
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).any():
        return Estimate(float("nan"), n=len(x), ci_method=method)
    reps = np.nanmean(x[boots], axis=1)
    return Estimate(float(np.nanmean(x)), percentile_interval(reps), method, n=int(np.isfinite(x).sum()))


def _ratio(num: np.ndarray, den: np.ndarray, boots: np.ndarray, method: str) -> Estimate:
    with np.errstate(all="ignore"):
        val = float(np.mean(num) / np.mean(den)) if np.mean(den) != 0 else float("nan")
        reps = num[boots].mean(1) / den[boots].mean(1)
    reps = np.where(np.isfinite(reps), reps, np.nan)
    return Estimate(val, percentile_interval(reps), method, null=0.0, n=len(num))


# ----------------------------------------------------------------------------------------------- result
@dataclass(frozen=True, eq=False)
class Confidence(Result):
    """What :func:`confidence` measured (module docstring; METHODS.md §15).

    ``screen`` (:class:`NeuronScreen`), ``effects`` (long table: ``neuron, role`` (candidate / requested /
    random), ``path`` (total / direct / mediated), ``metric``, ``value, ci_low, ci_high``, the random-neuron
    ``band_low, band_high``), ``entropy_neurons`` (those the rule calls so, by |ΔH_mediated|),
    ``frequency_neurons`` (screen flag), ``axis`` (long table of the axis figures), ``axis_overlap`` and
    ``axis_norm_share`` (:class:`~bayes_lens.Estimate`), ``answer`` (one sentence: is this axis the
    norm-temperature channel?), ``norm`` (the final norm, in words), ``seconds`` and ``passes``."""

    model_name: str
    layer: int
    axis_layer: int
    n_prompts: int
    task: str
    screen: NeuronScreen
    effects: object
    entropy_neurons: Tuple[int, ...]
    frequency_neurons: Tuple[int, ...]
    axis: object
    axis_overlap: Estimate
    axis_norm_share: Estimate
    answer: str
    verdict: str
    norm: str
    direct_method: str
    neuron_rule: str
    axis_rule: str
    seconds: float
    passes: int
    seed: int
    texts: Tuple[str, ...] = ()

    def effect(self, neuron, metric: str = "d_entropy_bits", path: str = "total") -> Estimate:
        """One neuron's (or ``"axis"``'s) effect as an :class:`~bayes_lens.Estimate`."""
        t = self.effects
        row = t[(t["neuron"].astype(str) == str(neuron)) & (t["metric"] == metric) & (t["path"] == path)]
        if row.empty:
            raise InvalidInputError(f"no effect of neuron {neuron!r} on {metric!r} ({path}); the neurons measured are "
                                    f"{sorted(set(t['neuron'].astype(str)))}.")
        r = row.iloc[0]
        return Estimate(float(r["value"]), (float(r["ci_low"]), float(r["ci_high"])),
                        "paired percentile bootstrap over prompts (95%)",
                        null_interval=None if not np.isfinite(r["band_low"]) else (float(r["band_low"]), float(r["band_high"])),
                        n=self.n_prompts)

    def to_dataframe(self):
        """Long format: the screen's rows, every effect and the axis figures, one ``section`` column apart."""
        import pandas as pd

        s = self.screen.to_dataframe().assign(section="screen", path="weights")
        e = self.effects.assign(section="effect", layer=self.layer)
        a = self.axis.assign(section="axis", layer=self.axis_layer)
        return pd.concat([s, e, a], ignore_index=True, sort=False)

    def plot(self):
        """Total against direct ΔH (bits) per measured neuron (the diagonal: no norm mediation)."""
        go = plotly()
        t = self.effects[self.effects["metric"] == "d_entropy_bits"]
        tot = t[t["path"] == "total"].set_index("neuron")
        dirc = t[t["path"] == "direct"].set_index("neuron")
        fig = go.Figure()
        for role in ("random", "candidate", "requested", "axis"):
            idx = [n for n in tot.index if tot.loc[n, "role"] == role]
            if idx:
                fig.add_trace(go.Scatter(x=dirc.loc[idx, "value"], y=tot.loc[idx, "value"], mode="markers",
                                         name=role, text=[str(i) for i in idx]))
        fig.update_layout(title="ΔH total vs direct (final norm's scale frozen)", xaxis_title="ΔH direct (bits)",
                          yaxis_title="ΔH total (bits)")
        return fig

    def _summary(self):
        rows = [("entropy neurons", ", ".join(map(str, self.entropy_neurons)) or "none", "", "rule: .neuron_rule")]
        for j in self.entropy_neurons[:3]:
            e = self.effect(j, path="mediated")
            rows.append((f"neuron {j} ΔH mediated (bits)", fmt(e.value), fmt_ci(e), ""))
        rows.append(("axis null-space overlap", fmt(self.axis_overlap.value), "",
                     f"Haar band {fmt_ci(self.axis_overlap.null_interval)}"))
        rows.append(("axis norm-mediated share", fmt(self.axis_norm_share.value), fmt_ci(self.axis_norm_share), ""))
        rows.append(("norm-temperature channel?", self.verdict, "", self.answer))
        return (f"{self.model_name}, layer {self.layer}, {self.n_prompts} prompts ({self.task}), "
                f"{self.seconds:.0f} s"), rows


# ----------------------------------------------------------------------------------------------- the entry
def confidence(model, items=None, *, layer: int = -1, k: Optional[int] = None, k_fraction: float = 0.01,
               n_candidates: int = 5, neurons: Sequence[int] = (), n_random_neurons: int = 20,
               axis: str = "ridge", axis_layer: int = -1, n_random_axes: int = 3, n_random: int = 200,
               n_boot: int = 1000, alpha: float = 0.05, min_effect_bits: float = 0.0, batch_size: int = 16,
               progress: Optional[bool] = None, seed: int = 0) -> Confidence:
    """The confidence mechanism of ``model`` on ``items`` (task items, e.g. SULA's, or plain texts; None: 60
    SULA prompts), joined to the entropy axis (module docstring; METHODS.md §15).

    ``layer`` the MLP layer screened and ablated (default the last); ``k`` / ``k_fraction`` the null space's
    rank; ``n_candidates`` top screen neurons plus ``neurons`` are ablated, beside ``n_random_neurons`` random
    ones (the band); ``axis`` ``"ridge"`` or ``"pc1"`` at ``axis_layer``'s ``resid_post``; ``n_random_axes``
    Haar directions removed as the axis's control.

    >>> import bayes_lens as bl
    >>> model, planted = bl.models.tiny.confidence_model("bridge")
    >>> res = bl.confidence(model, n_random_neurons=6, n_boot=200, n_random_axes=1)   # doctest: +SKIP
    >>> res.entropy_neurons[:1] == (planted.entropy_neuron,)                         # doctest: +SKIP
    True
    """
    import pandas as pd

    t0 = time.perf_counter()
    info = adapter.model_info(model)
    layer = adapter.resolve_layer(model, layer)
    axis_layer = adapter.resolve_layer(model, axis_layer)
    axis = check_choice(axis, "axis", ("ridge", "pc1"))
    n_candidates = check_count(n_candidates, "n_candidates")
    n_random_neurons = check_count(n_random_neurons, "n_random_neurons")
    n_random_axes = check_count(n_random_axes, "n_random_axes")
    n_boot = check_count(n_boot, "n_boot")
    min_effect_bits = check_float(min_effect_bits, "min_effect_bits", min=0.0)
    seed = check_seed(seed)
    d_mlp = int(getattr(model.cfg, "d_mlp", 0) or 0)
    requested = [check_int(j, "each of neurons", min=0, max=d_mlp - 1) for j in neurons]
    norm = adapter.final_norm(model)

    texts, answer_ids, post_exact, strata, target, task = _prepare(model, items)
    n = len(texts)
    if n < 4:
        raise InvalidInputError(f"the confidence analysis needs at least 4 prompts, got {n}.")

    # the unigram proxy: one pass on the boundary token alone
    tok = getattr(model, "tokenizer", None)
    boundary = (getattr(tok, "bos_token", None) or getattr(tok, "eos_token", None)) if tok is not None else None
    log_pu, proxy = None, "no unigram proxy (the tokenizer has no BOS or EOS token)"
    if boundary:
        rc_u = collect(model, [boundary], reads=[_FinalTop(full=True)], batch_size=1, progress=progress,
                       desc="confidence: unigram proxy")
        log_pu, proxy = rc_u["final_logprobs"][0].numpy(), _PROXY.format(tok=boundary)

    null = null_space(model, k, k_fraction=k_fraction)
    scr = screen_neurons(model, layer, k=k, k_fraction=k_fraction, n_random=n_random, alpha=alpha,
                         log_unigram=log_pu, unigram_proxy=proxy, seed=seed)
    runner = _Runner(model, texts, answer_ids, target, layer=layer, axis_layer=axis_layer, batch_size=batch_size,
                     progress=progress)
    tcol = np.array([runner.col[int(t)] if t >= 0 else -1 for t in target], dtype=np.int64)
    acol = None if answer_ids is None else [runner.col[i] for i in answer_ids]
    boots = bootstrap_indices(n, n_boot, seed=seed, strata=strata)
    method = "paired percentile bootstrap over prompts (95%)" + (", within k" if strata is not None else "")

    cands = scr.top(n_candidates)
    chosen = list(dict.fromkeys(cands + requested))
    rng = np.random.default_rng(seed + 1)
    pool = np.setdiff1d(np.arange(d_mlp), chosen)
    randoms = [int(j) for j in rng.choice(pool, size=min(n_random_neurons, len(pool)), replace=False)]
    mean_act = runner.mlp_rows.mean(0)

    per: Dict[Tuple[str, str], Dict[str, Dict[str, np.ndarray]]] = {}
    roles: Dict[str, str] = {}
    for j in chosen + randoms:
        e = np.zeros((d_mlp, 1))
        e[j, 0] = 1.0
        iv = Intervention(layer=layer, site="mlp_post", basis=e, op="mean", positions="final",
                          source=mean_act.astype(np.float32), label=f"neuron {layer}.{j} mean-ablated")
        tot, dirc = runner.pair([iv], f"confidence: neuron {layer}.{j}")
        pt = _per_prompt(runner.clean, tot, tcol, acol, post_exact)
        pd_ = _per_prompt(runner.clean, dirc, tcol, acol, post_exact)
        pm = {m: pt[m] - pd_[m] for m in _MEDIATED if m in pt}
        per[str(j)] = {"total": pt, "direct": pd_, "mediated": pm}
        roles[str(j)] = "random" if j in randoms else ("candidate" if j in cands else "requested")

    # the axis, its removal total vs direct, and Haar directions as its control
    from .estimators import PC1Axis, RidgeAxis

    ent = runner.clean["H"]
    est = RidgeAxis() if axis == "ridge" else PC1Axis()
    basis = est.fit(runner.resid_rows, ent).basis_
    if basis is None:
        raise InvalidInputError("the entropy axis could not be fitted (every ridge weight is 0: the rows do not vary "
                                "with the entropy); pass more or more varied prompts.")
    u = basis[:, 0] / np.linalg.norm(basis[:, 0])
    axis_dirs = {"axis": u}
    for i in range(n_random_axes):
        axis_dirs[f"random direction {i}"] = haar_draw(info.d_model, 1, seed=seed, layer=axis_layer, i=i)[:, 0]
    for name, vec in axis_dirs.items():
        iv = Intervention(layer=axis_layer, site="resid_post", basis=vec[:, None], op="remove", label=name)
        tot, dirc = runner.pair([iv], f"confidence: {name} removed")
        pt = _per_prompt(runner.clean, tot, tcol, acol, post_exact)
        pd_ = _per_prompt(runner.clean, dirc, tcol, acol, post_exact)
        per[name] = {"total": pt, "direct": pd_, "mediated": {m: pt[m] - pd_[m] for m in _MEDIATED if m in pt}}
        roles[name] = "axis" if name == "axis" else "random direction"

    # estimates, bands
    rows = []
    for name, paths in per.items():
        for path, metrics in paths.items():
            for metric, x in metrics.items():
                e = _estimate(x, boots, method)
                rows.append(dict(neuron=name, role=roles[name], path=path, metric=metric, value=e.value,
                                 ci_low=e.ci_low, ci_high=e.ci_high))
    eff = pd.DataFrame(rows)
    rand_rows = eff[eff["role"] == "random"]
    band = rand_rows.groupby(["path", "metric"])["value"].agg(
        band_low=lambda v: float(np.quantile(v, 0.025)) if len(v) else float("nan"),
        band_high=lambda v: float(np.quantile(v, 0.975)) if len(v) else float("nan"),
        band_abs_high=lambda v: float(np.quantile(np.abs(v), 0.975)) if len(v) else float("nan")).reset_index()
    eff = eff.merge(band, on=["path", "metric"], how="left")
    eff["band_low"] = eff["band_low"].astype(float)
    eff["band_high"] = eff["band_high"].astype(float)

    # the entropy-neuron rule
    flagged = set(int(j) for j in scr.table.loc[scr.table["null_space"], "neuron"])
    med = eff[(eff["metric"] == "d_entropy_bits") & (eff["path"] == "mediated")].set_index("neuron")
    dirh = eff[(eff["metric"] == "d_entropy_bits") & (eff["path"] == "direct")].set_index("neuron")
    ent_neurons = []
    for name in chosen:
        r = med.loc[str(name)]
        bar = max(float(r["band_abs_high"]) if np.isfinite(r["band_abs_high"]) else 0.0, min_effect_bits)
        resolved = (r["ci_low"] > 0 or r["ci_high"] < 0)
        if name in flagged and resolved and abs(r["value"]) > bar and abs(dirh.loc[str(name), "value"]) < abs(r["value"]):
            ent_neurons.append(name)
    ent_neurons.sort(key=lambda j: -abs(float(med.loc[str(j), "value"])))
    eff = eff.drop(columns=["band_abs_high"])

    # the axis figures
    from scipy import stats as st

    nb, _, q = null
    kk, dq = nb.shape[1], q.shape[1]
    uq = (q @ q.T) @ u
    uq = uq / np.linalg.norm(uq)
    overlap, how = null_space_overlap(uq, nb)
    band_ov = (float(st.beta.ppf(0.025, kk / 2, (dq - kk) / 2)), float(st.beta.ppf(0.975, kk / 2, (dq - kk) / 2)))
    ov = Estimate(overlap, (overlap, overlap), f"exact (a weight statistic; {how})", null=kk / dq,
                  null_interval=band_ov, n=None)
    ax = per["axis"]
    def share_of(name, method=""):
        m, d_ = np.abs(per[name]["mediated"]["d_entropy_bits"]), np.abs(per[name]["direct"]["d_entropy_bits"])
        return _ratio(m, m + d_, boots, method)

    share = share_of("axis", "percentile bootstrap of the ratio of means over prompts (95%)")
    rand_share = [share_of(nm).value for nm in axis_dirs if nm != "axis"]
    if rand_share:
        share = Estimate(share.value, share.ci, share.ci_method, null=float(np.nanmean(rand_share)),
                         null_interval=(float(np.nanmin(rand_share)), float(np.nanmax(rand_share))), n=n)
    verdict, answer = _answer(ov, share, axis)
    top_null = [int(j) for j in (ent_neurons or scr.top(3))[:3]]
    wout = adapter.mlp_out_weights(model, layer)
    cos = {j: float(abs(wout[j] @ u) / max(np.linalg.norm(wout[j]), 1e-300)) for j in top_null}
    arows = [dict(metric="null_space_overlap", value=ov.value, ci_low=ov.ci_low, ci_high=ov.ci_high,
                  null_low=band_ov[0], null_high=band_ov[1], neuron="axis"),
             dict(metric="norm_mediated_share", value=share.value, ci_low=share.ci_low, ci_high=share.ci_high,
                  null_low=share.null_interval[0] if share.null_interval else float("nan"),
                  null_high=share.null_interval[1] if share.null_interval else float("nan"), neuron="axis")]
    cos_null = 1.0 / math.sqrt(info.d_model)
    for j, c in cos.items():
        arows.append(dict(metric="abs_cos_with_w_out", value=c, ci_low=c, ci_high=c, null_low=0.0,
                          null_high=1.96 * cos_null, neuron=str(j)))
    axis_tab = pd.DataFrame(arows)
    name = adapter.model_info(model).name
    return Confidence(
        model_name=name, layer=layer, axis_layer=axis_layer, n_prompts=n, task=task, screen=scr, effects=eff,
        entropy_neurons=tuple(int(j) for j in ent_neurons),
        frequency_neurons=tuple(int(j) for j in scr.table.loc[scr.table["frequency"], "neuron"]),
        axis=axis_tab, axis_overlap=ov, axis_norm_share=share, answer=answer, verdict=verdict,
        norm=f"{norm.kind} norm, gain {norm.gain_rule}" + (f", final logit soft-cap {norm.softcap:g} (in both paths)"
                                                         if norm.softcap else ""),
        direct_method="ln_final.hook_scale swapped to its clean value at the final token (op='swap', width 1)",
        neuron_rule=NEURON_RULE, axis_rule=AXIS_RULE, seconds=time.perf_counter() - t0, passes=runner.passes + 1,
        seed=seed, texts=tuple(texts))


def null_space_overlap(u: np.ndarray, nb: np.ndarray) -> Tuple[float, str]:
    """``(‖Nᵀu‖², how)`` for a unit vector u ``[d]`` and an orthonormal basis N ``[d, k]``: ‖Nᵀu‖² (the projection kernel of span(u) and span(N)): TransformerLens 4.3's ``projection_kernel`` where
    present, else numpy."""
    tools = adapter.projection_kernel()
    if tools is not None:
        pk, ortho, _ = tools
        a = ortho(torch.as_tensor(u[:, None]), rank=1)
        b = ortho(torch.as_tensor(nb), rank=nb.shape[1])
        return float(pk(a, b).score), "TransformerLens projection_kernel"
    return float(((nb.T @ u) ** 2).sum()), "numpy ‖Nᵀu‖²"


def _pct(x: float) -> str:
    """A share as a percentage to two significant digits (0.00034 -> "0.034%"; "0%" hid Gemma's small share)."""
    v = 100 * float(x)
    return f"{v:.0f}%" if abs(v) >= 10 else f"{v:.2g}%"


def _answer(overlap: Estimate, share: Estimate, axis: str) -> Tuple[str, str]:
    """``(verdict, sentence)`` of :data:`AXIS_RULE`."""
    what = f"the {axis} entropy axis"
    lo, hi = share.ci
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "undecided", (f"Undecided: removing {what} changes the entropy of no prompt, so whether it is the "
                             "norm-temperature channel cannot be told.")
    above = overlap.value > overlap.null_interval[1]
    if above and lo > 0.5:
        return "yes", (f"Yes: {what} is the norm-temperature channel - it overlaps W_U's null space beyond the Haar "
                       f"band ({overlap.value:.3g} vs ≤ {overlap.null_interval[1]:.3g}) and {_pct(share.value)} "
                       f"(95% CI {_pct(lo)} to {_pct(hi)}) of its removal's entropy effect goes through the final norm's scale.")
    if hi < 0.5:
        return "no", (f"No: {what} is not the norm-temperature channel - only {_pct(share.value)} (95% CI {_pct(lo)} to "
                      f"{_pct(hi)}) of its removal's entropy effect goes through the final norm's scale (null-space "
                      f"overlap {overlap.value:.3g}, Haar band up to {overlap.null_interval[1]:.3g}).")
    return "undecided", (f"Undecided: {_pct(share.value)} (95% CI {_pct(lo)} to {_pct(hi)}) of {what}'s removal effect on "
                         f"the entropy goes through the final norm's scale, null-space overlap {overlap.value:.3g} "
                         f"(Haar band up to {overlap.null_interval[1]:.3g}); the rule needs the overlap above the band "
                         "and the interval above 0.5 for yes, or the interval below 0.5 for no.")
