"""SULA: an in-context task with an exact Bayesian posterior, its controls, and calibration.

METHODS.md §6 (Paper A, "Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752,
§4.3 and §5.2). A prompt holds ``k`` labelled examples and a query; the model must say which of two
nonsense labels L1, L2 the query has. The generative model of one prompt:

* hidden label y ∈ {L1, L2}, P(y = L1) = ``prior`` (default ½);
* each of the k example labels equals y with probability ``p`` (default 0.9), else the other label;
* example words (and, optionally, the query word) are drawn from a fixed list of *carrier* words,
  independently of y, so they carry no evidence.

With n₁ examples labelled L1 and n₂ = k − n₁ labelled L2 the posterior is exact:

    logit P(y = L1 | D) = logit(prior) + (n₁ − n₂) · log(p / (1 − p)),

which under a uniform prior is Paper A's P(y | D) = 1 / (1 + ((1 − p)/p)^(2m − k)) (m = examples
labelled y). For p = 0.9 the expected posterior entropy by k = 0, 1, 2, 4, 8 is 1.000, 0.469, 0.258,
0.078, 0.008 bits (:func:`expected_bayes_entropy_bits`, a binomial sum).

The model's posterior is its next-token distribution at the final position restricted to the two
label tokens (each label must be ONE token with its leading space) and renormalized; the raw mass
on the two labels is reported too (a model that ignores the task shows up there). :func:`evaluate`
reports per k and overall: MAE(H_model, H_Bayes) in bits, Pearson and Spearman of the entropies,
KL(Bayes ‖ model) in bits, ECE and Brier score of P(L1) against the hidden label, all with 95%
percentile bootstrap intervals over prompts; and the geometry on the task: one shared
(standardized) PCA of the final-token values (``hook_v``, per KV head) at ``layer`` over all
prompts, with ρ(PC1, H_Bayes), ρ(PC1, H_model), ρ(k, PC1) and permutation p-values.

Controls (``control=``), each with its own exact posterior:

* ``"lexical_remap"`` — another label pair, same generative model (should behave like the main task);
* ``"shuffled_labels"`` — each example label an independent fair coin, unrelated to y: the posterior
  is the prior (1 bit under a uniform prior) for every k;
* ``"evidence_removed"`` — example labels replaced by a neutral placeholder (``"?"``), keeping the
  structure: posterior = prior (1 bit);
* ``"carriers_masked"`` — Paper A's own variant: the carrier words are masked (``"___"``) and the
  labels kept. Under the stated generative model carriers carry no evidence, so its exact posterior
  is the *main task's* posterior; it tests whether the model needs the words, not the evidence.

Every condition draws the same random numbers in the same order, so with one seed the conditions are
*paired*: the same hidden labels, carrier words and noise draws (``.example_labels`` always holds the
labels the generator drew; in ``evidence_removed`` they are hidden behind the placeholder and in
``shuffled_labels`` they are the coin flips shown).

Example
-------
>>> import bayes_lens as bl
>>> from bayes_lens.models.tiny import tiny_tokenizer
>>> prompts = bl.sula.make_prompts(tiny_tokenizer(), ks=(0, 2), n_per_k=2, seed=0)
>>> prompts.labels
('dax', 'lug')
>>> prompts[0].text, round(prompts[0].bayes_entropy_bits, 3)
('query:', 1.0)
>>> round(bl.sula.bayes_posterior([0, 0, 1], p=0.9), 4)        # one net vote for the first label
0.9
>>> model = bl.models.tiny.tiny_model("bridge")                 # any TransformerLens model
>>> res = bl.sula.evaluate(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4), n_boot=100)
>>> res.table[["k", "mae_bits", "ece", "label_mass"]].shape      # a row per k, and one for all
(3, 4)
"""

from ._evaluate import (
    SulaControls,
    SulaResult,
    as_prompts,
    evaluate,
    evaluate_reduced,
    answer_posterior,
    label_posterior,
    label_token_ids,
    run_controls,
)
from ._task import (
    CANDIDATE_LABELS,
    CARRIER_WORDS,
    CONTROLS,
    TEMPLATES,
    SulaItem,
    SulaPrompts,
    SulaTemplate,
    bayes_posterior,
    expected_bayes_entropy_bits,
    make_prompts,
)

__all__ = [
    "CANDIDATE_LABELS",
    "CARRIER_WORDS",
    "CONTROLS",
    "TEMPLATES",
    "SulaTemplate",
    "SulaItem",
    "SulaPrompts",
    "SulaResult",
    "SulaControls",
    "make_prompts",
    "bayes_posterior",
    "expected_bayes_entropy_bits",
    "evaluate",
    "evaluate_reduced",
    "answer_posterior",
    "label_posterior",
    "label_token_ids",
    "as_prompts",
    "run_controls",
]

from .._namespace import package_dir, submodule_getattr  # noqa: E402

__dir__ = package_dir(globals())
__getattr__ = submodule_getattr(globals())
