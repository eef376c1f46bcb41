"""In-context tasks with an exact posterior: the protocol, two tasks beyond SULA, and task data as files.

METHODS.md §6a–§6c. A *task item* is a prompt (a ``str``) carrying its answers (K ≥ 2 candidate
continuations, each one token in the model's tokenizer exactly as written) and the exact posterior
over them (with its entropy in bits), the amount of evidence ``k``, the drawn ``outcome`` and the
no-evidence posterior; a prompt set (:class:`TaskPrompts`) carries the task name, seed, generator
version and parameters. :func:`bayes_lens.sula.evaluate` measures calibration on any task's items
(MAE of the model's and the exact entropies in bits, Pearson/Spearman, KL, multi-class Brier score,
top-answer ECE). SULA's items (Paper A, arXiv 2512.23752, §4.3; METHODS.md §6) satisfy the protocol.

Tasks shipped here:

* :func:`categorical_prompts` — K symbols, symmetric Dirichlet(α) prior; posterior predictive
  (n_j + α) / (k + Kα) (METHODS.md §6b);
* :func:`gaussian_prompts` — numbers from N(μ, σ²) in the format of "The Shape of Beliefs" (arXiv
  2602.02315), Normal or Normal–Inverse-Gamma prior; the exact posterior over the first digit of the
  next number (METHODS.md §6c).

:func:`export` writes any prompt set (SULA with its controls too) as JSONL plus a dataset card
that ``datasets.load_dataset("json", data_files=...)`` reads; :func:`load` and :func:`from_records`
give the same items back, bit for bit, after checking the checksums.

A task of your own is a few lines: build :class:`TaskItem` objects with their exact posterior.

Example
-------
>>> import bayes_lens as bl
>>> def coin_prompts(seqs):          # Laplace's rule: P(next = 1 | s ones in n) = (s + 1) / (n + 2)
...     items = [bl.tasks.TaskItem("Sequence:" + "".join(" " + str(b) for b in s), task="coin",
...                                answers=(" 0", " 1"), k=len(s), prior_posterior=(0.5, 0.5),
...                                posterior=(1 - (sum(s) + 1) / (len(s) + 2), (sum(s) + 1) / (len(s) + 2)))
...              for s in seqs]
...     return bl.tasks.TaskPrompts(items, task="coin", seed=None, generator_version="coin-1")
>>> coin = coin_prompts([(), (1,), (1, 1, 0), (0, 0, 0, 0)])
>>> coin[2].text, [round(p, 2) for p in coin[2].posterior]
('Sequence: 1 1 0', [0.4, 0.6])
>>> model = bl.models.tiny.tiny_model("bridge")
>>> res = bl.sula.evaluate(model, coin, n_boot=50)          # calibration against the exact posterior
>>> res.condition, res.table.shape[0]                        # one row per k, and one for all
('coin', 5)
>>> cat = bl.tasks.categorical_prompts(model, n_symbols=3, ks=(0, 2, 8), n_per_k=4)
>>> bool(bl.sula.evaluate(model, cat, n_boot=50).mae_bits.value >= 0)
True
"""

from ._categorical import CATEGORICAL_VERSION, categorical_prompts, dirichlet_predictive
from ._export import CARD_FORMAT, card_path, export, from_records, load, read_card
from ._posterior import answer_posterior, label_posterior
from ._gaussian import GAUSSIAN_VERSION, PRIORS, gaussian_predictive, gaussian_prompts, leading_digit_probs
from ._protocol import (
    STANDARD_FIELDS,
    PromptTuple,
    TaskItem,
    TaskPrompts,
    answer_token_ids,
    as_task_prompts,
    choose_answers,
    get_tokenizer,
    is_task_item,
    posterior_entropy_bits,
    register_task,
    single_token_id,
)

__all__ = [
    "answer_posterior",
    "label_posterior",
    "TaskItem",
    "TaskPrompts",
    "STANDARD_FIELDS",
    "is_task_item",
    "as_task_prompts",
    "answer_token_ids",
    "posterior_entropy_bits",
    "categorical_prompts",
    "dirichlet_predictive",
    "CATEGORICAL_VERSION",
    "gaussian_prompts",
    "gaussian_predictive",
    "leading_digit_probs",
    "GAUSSIAN_VERSION",
    "PRIORS",
    "export",
    "load",
    "from_records",
    "read_card",
    "card_path",
    "CARD_FORMAT",
    "register_task",
]

from .._namespace import package_dir, submodule_getattr  # noqa: E402

__dir__ = package_dir(globals())
__getattr__ = submodule_getattr(globals())
