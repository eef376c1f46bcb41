"""Entropy error of a wind-tunnel model against the exact Bayes posterior (Paper I's metric).

On ``n`` freshly generated sequences, at every scored position k the model's predictive entropy
H_model = −Σ_v p(v) log2 p(v) over the **full** vocabulary is compared with the exact Bayes
entropy H_Bayes of the task (METHODS.md §11; Paper A Part I, arXiv 2512.22471). Paper I's number
is the mean absolute error between the per-position means::

    MAE = (1/K) Σ_k | mean_seq H_model(k) − mean_seq H_Bayes(k) |      (bits)

We also report the stricter per-sequence error mean |H_model − H_Bayes| (it differs from the MAE
when the Bayes entropy varies across sequences at the same position, as in the HMM task) and
KL(Bayes ‖ model) in bits. 95% percentile bootstrap intervals resample sequences (seeded).

Read the MAE together with the KL: the MAE compares entropies only, so a model that puts the
right *amount* of uncertainty on the wrong symbols scores well on it (for the bijection the Bayes
entropy depends on the position alone); the KL is small only when the mass sits on the symbols
the posterior allows.

Example
-------
>>> import bayes_lens as bl
>>> model, task = bl.windtunnel.load("bijection")              # the shipped checkpoint (V = 10)
>>> ev = bl.windtunnel.evaluate(model, task, n_seqs=20, seed=0, n_boot=50)
>>> bool(ev.mae_bits.value < 0.1)                                   # within a tenth of a bit of Bayes
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from .._progress import progress as progress_bar
from .._results import Estimate, Result, fmt, fmt_ci, plotly
from .._validate import check_count, check_int
from ..errors import InvalidInputError
from ..metrics.stats import entropy_bits
from .tasks import Batch, make_task

__all__ = ["WindTunnelEval", "evaluate", "entropy_stats", "position_mae_bits"]


@dataclass(frozen=True, eq=False)
class WindTunnelEval(Result):
    """Entropy error of a model on a wind-tunnel task.

    Attributes
    ----------
    mae_bits: Paper I's MAE of the per-position mean entropies (bits), an :class:`~bayes_lens.Estimate`
        with its 95% percentile bootstrap interval over sequences (``null`` 0: exact Bayes).
    seq_mae_bits: mean over sequences and positions of |H_model − H_Bayes| (bits), an ``Estimate``.
    kl_bits: mean KL(Bayes ‖ model) over sequences and positions (bits).
    table: one row per position k: ``model_entropy_bits``, ``bayes_entropy_bits`` (means),
        ``abs_error_bits`` (|difference of means|), ``seq_abs_error_bits``, ``kl_bits``.
    model_entropy_bits, bayes_entropy_bits: ``[n, K]`` per sequence and position.
    """

    task: str
    n: int
    seed: int
    mae_bits: Estimate
    seq_mae_bits: Estimate
    kl_bits: float
    table: object
    model_entropy_bits: np.ndarray
    bayes_entropy_bits: np.ndarray

    def to_dataframe(self):
        """Long format: one row per (position, quantity) with ``value_bits``."""
        df = self.table.melt(id_vars=["position"], var_name="quantity", value_name="value_bits")
        df.insert(0, "task", self.task)
        return df

    def plot(self):
        """Mean model vs Bayes entropy by position (plotly)."""
        go = plotly()
        fig = go.Figure()
        fig.add_scatter(x=self.table["position"], y=self.table["bayes_entropy_bits"], name="Bayes (exact)",
                        mode="lines+markers")
        fig.add_scatter(x=self.table["position"], y=self.table["model_entropy_bits"], name="model",
                        mode="lines+markers")
        fig.update_layout(title=f"{self.task}: MAE {self.mae_bits:.4f} bits (n = {self.n})",
                          xaxis_title="position k", yaxis_title="entropy (bits)")
        return fig

    def _summary(self):
        return f"task {self.task!r}, n = {self.n} sequences, seed {self.seed}", [
            ("MAE of the mean entropies", f"{fmt(self.mae_bits)} bits", fmt_ci(self.mae_bits), "Paper I's statistic"),
            ("per-sequence MAE", f"{fmt(self.seq_mae_bits)} bits", fmt_ci(self.seq_mae_bits), ""),
            ("KL(Bayes || model)", f"{fmt(self.kl_bits)} bits", "", ""),
        ]


def entropy_stats(logits: torch.Tensor, batch: Batch) -> Tuple[np.ndarray, np.ndarray]:
    """Model entropy (bits, full vocabulary) and KL(Bayes ‖ model) (bits) at the targets, ``[n, K]`` each.

    ``logits`` is ``[n, seq_len, d_vocab]`` (or already gathered ``[n, K, d_vocab]``).
    """
    if logits.shape[1] != len(batch.target_positions):
        logits = logits[:, torch.as_tensor(batch.target_positions)]
    logp = torch.log_softmax(logits.double(), dim=-1)
    h = entropy_bits(logits, from_logits=True)
    q = torch.as_tensor(batch.bayes_probs)
    logp_ans = logp[..., torch.as_tensor(batch.answer_ids)]
    log_q = torch.where(q > 0, q.log(), torch.zeros_like(q))
    kl = (q * (log_q - logp_ans)).sum(-1) / np.log(2)
    return h.detach().cpu().numpy(), kl.detach().cpu().numpy()


def position_mae_bits(model_h: np.ndarray, bayes_h: np.ndarray) -> float:
    """Mean over positions of |mean model entropy − mean Bayes entropy| (bits): Paper A Part I's error."""
    return float(np.abs(model_h.mean(0) - bayes_h.mean(0)).mean())


def _forward_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    out = model(tokens)
    return out.logits if hasattr(out, "logits") else out


def _check_model_vocab(model, task) -> None:
    d_vocab = None
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    for attr in ("d_vocab", "vocab_size"):
        d_vocab = d_vocab or getattr(cfg, attr, None)
    if d_vocab is not None and int(d_vocab) != task.d_vocab:
        raise InvalidInputError(
            f"the model's vocabulary has {d_vocab} tokens but the {task.name} task's has {task.d_vocab}; "
            "evaluate a model trained on this task (bl.windtunnel.load / train)."
        )


def evaluate(model, task, n_seqs: int = 1000, *, seed: int = 0, batch_size: int = 250, n_boot: int = 1000,
             progress: Optional[bool] = None) -> WindTunnelEval:
    """Evaluate ``model`` on ``n_seqs`` fresh sequences of ``task`` (seeded) against the exact posterior.

    ``model`` is a TransformerLens model (HookedTransformer or TransformerBridge) built for the
    task's vocabulary, or the Hugging Face ``LlamaForCausalLM`` used in training. ``task`` is a
    task object or a name (``"bijection"``/``"hmm"`` with default parameters).
    """
    task = make_task(task)
    n = n_seqs
    n = check_int(n, "n_seqs", min=2)  # the bootstrap needs two sequences
    batch_size = check_count(batch_size, "batch_size")
    _check_model_vocab(model, task)
    batch = task.sample(int(n), seed=seed)
    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError):
        device = torch.device("cpu")
    hs, kls = [], []
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        with torch.inference_mode():
            starts = range(0, n, batch_size)
            for s in progress_bar(starts, desc=f"wind tunnel: {task.name}", total=len(starts), enabled=progress):
                sub = Batch(tokens=batch.tokens[s:s + batch_size], target_positions=batch.target_positions,
                            answer_ids=batch.answer_ids, bayes_probs=batch.bayes_probs[s:s + batch_size],
                            bayes_entropy_bits=batch.bayes_entropy_bits[s:s + batch_size])
                logits = _forward_logits(model, torch.as_tensor(sub.tokens, device=device))
                h, kl = entropy_stats(logits.float().cpu(), sub)
                hs.append(h)
                kls.append(kl)
    finally:
        if was_training:
            model.train()
    return _result(task, np.concatenate(hs), batch.bayes_entropy_bits, np.concatenate(kls), n, seed, n_boot)


def _result(task, model_h, bayes_h, kl, n, seed, n_boot) -> WindTunnelEval:
    import pandas as pd

    from ..metrics.stats import bootstrap_ci

    def seq_mae(m, b):
        return float(np.abs(m - b).mean())

    mae_ci = bootstrap_ci(position_mae_bits, model_h, bayes_h, n_boot=n_boot, seed=seed)
    seq_ci = bootstrap_ci(seq_mae, model_h, bayes_h, n_boot=n_boot, seed=seed)
    table = pd.DataFrame({
        "position": np.arange(1, model_h.shape[1] + 1),
        "model_entropy_bits": model_h.mean(0),
        "bayes_entropy_bits": bayes_h.mean(0),
        "abs_error_bits": np.abs(model_h.mean(0) - bayes_h.mean(0)),
        "seq_abs_error_bits": np.abs(model_h - bayes_h).mean(0),
        "kl_bits": kl.mean(0),
    })
    method = "95% percentile bootstrap over sequences"
    return WindTunnelEval(task=task.name, n=int(n), seed=int(seed),
                          mae_bits=Estimate(position_mae_bits(model_h, bayes_h), mae_ci, method, null=0.0, n=int(n)),
                          seq_mae_bits=Estimate(seq_mae(model_h, bayes_h), seq_ci, method, null=0.0, n=int(n)),
                          kl_bits=float(kl.mean()),
                          table=table, model_entropy_bits=model_h, bayes_entropy_bits=bayes_h)
