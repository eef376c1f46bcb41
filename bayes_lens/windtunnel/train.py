"""Training of wind-tunnel models on the CPU: seeded, checkpointed (safetensors + JSON), resumable.

The model is a small Llama (:class:`~bayes_lens.windtunnel.model.ModelConfig`) trained with AdamW
on freshly generated sequences (never repeated: batch t is drawn with seed (seed, t)), with a
cross-entropy loss on the **scored positions only** (the y-symbol after each x for the bijection,
the next observation for the HMM), as in Paper A Part I (arXiv 2512.22471, METHODS.md §11). The
learning rate warms up linearly, then follows a cosine down to ``min_lr_ratio·lr``.

Every draw is seeded: the initial weights (``seed``), the training batches ((seed, step)) and the
evaluation sets (``eval_seed``, disjoint from training seeds), so ``train`` is reproducible and a
run resumed from a checkpoint (``resume=True``; the checkpoint stores the AdamW moments) gives the
same weights as an uninterrupted run of the same total ``steps``.

Paper I used V = 20, 6 layers, 6 heads, width 192 on a GPU. On a shared 2-core CPU we ship smaller
models (see ``bayes_lens/data/windtunnel/*/config.json`` for the exact configuration and command).

Example
-------
>>> import bayes_lens as bl
>>> task = bl.windtunnel.BijectionTask(V=6)
>>> run = bl.windtunnel.train(task, bl.windtunnel.TrainConfig(n_layers=1), steps=300, seed=0)  # doctest: +SKIP
>>> run.final_mae_bits                                                                         # doctest: +SKIP
>>> model = run.model(kind="auto")                                                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch

from .._progress import progress as progress_bar
from .._results import Result, fmt, plotly
from .._validate import COUNT_RULES, check_float, check_int, check_output_dir, check_positive_int, check_seed
from ..errors import CheckpointError, InvalidInputError
from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .evaluate import entropy_stats, position_mae_bits
from .model import ModelConfig, build_hf, to_tl
from .tasks import make_task

__all__ = ["TrainConfig", "TrainResult", "train"]

_TRAIN_STREAM, _EVAL_STREAM = 1, 2


@dataclass(frozen=True)
class TrainConfig:
    """Model shape and optimization settings of a wind-tunnel run.

    ``n_ctx=None`` sizes the context to the task's sequence length. ``n_kv_heads=None`` is ordinary
    multi-head attention. ``eval_seed`` seeds the held-out evaluation sets used during training.
    """

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_head: int = 16
    d_mlp: int = 256
    n_kv_heads: Optional[int] = None
    n_ctx: Optional[int] = None
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_seed: int = 10_000

    def __post_init__(self):
        for f in ("batch_size", "warmup"):
            v = getattr(self, f)
            object.__setattr__(self, f, check_int(v, f"TrainConfig.{f}",
                                                  min=COUNT_RULES["batch_size"] if f == "batch_size" else 0))
        for f in ("lr", "grad_clip"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidInputError(f"TrainConfig.{f} must be a positive number, got {v!r}.")
        if not 0 <= self.min_lr_ratio <= 1:
            raise InvalidInputError(f"TrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}.")
        check_float(self.weight_decay, "TrainConfig.weight_decay", min=0.0)
        self.model_config(None)  # validates the shape

    def model_config(self, task) -> ModelConfig:
        """The :class:`ModelConfig` for ``task`` (context at least the task's sequence length)."""
        need = task.seq_len if task is not None else 1
        n_ctx = max(self.n_ctx or 0, need)
        return ModelConfig(n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads, d_head=self.d_head,
                           d_mlp=self.d_mlp, n_kv_heads=self.n_kv_heads, n_ctx=n_ctx)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, eq=False)
class TrainResult(Result):
    """A finished (or resumed-and-finished) training run.

    ``history`` has one row per evaluation: ``step``, ``loss_nats`` (mean training loss since the
    previous row), ``mae_bits`` (Paper I's error on ``n_eval_seqs`` held-out sequences). ``model(kind)``
    builds a TransformerLens model from the final weights.
    """

    task: object
    config: TrainConfig
    steps: int
    seed: int
    final_mae_bits: float
    wall_s: float
    history: object
    path: Optional[str]
    _weights: Dict[str, torch.Tensor] = dataclasses.field(repr=False)

    def model(self, kind: str = "auto"):
        """The trained model as a TransformerLens ``HookedTransformer`` / ``TransformerBridge``."""
        return to_tl(self._weights, self.config.model_config(self.task), self.task.vocab, kind,
                     name=f"windtunnel-{self.task.name}")

    @property
    def weights(self) -> Dict[str, torch.Tensor]:
        return dict(self._weights)

    def _summary(self):
        c = self.config
        title = (f"task {self.task!r}, {c.n_layers} layers x d_model {c.d_model}, {self.steps} steps, "
                 f"seed {self.seed}")
        return title, [("final MAE", f"{fmt(self.final_mae_bits)} bits", "", f"{self.wall_s:.1f} s of training"),
                       ("checkpoint", str(self.path), "", "")]

    def to_dataframe(self):
        df = self.history.melt(id_vars=["step"], var_name="quantity", value_name="value")
        df.insert(0, "task", self.task.name)
        return df

    def plot(self):
        go = plotly()
        fig = go.Figure()
        fig.add_scatter(x=self.history["step"], y=self.history["mae_bits"], name="MAE (bits)", mode="lines+markers")
        fig.update_layout(title=f"{self.task.name}: entropy error during training", xaxis_title="step",
                          yaxis_title="MAE (bits)", yaxis_type="log")
        return fig


def _lr_at(step: int, steps: int, cfg: TrainConfig) -> float:
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, steps - cfg.warmup)
    frac = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def _batch_seed(seed: int, stream: int, index: int) -> int:
    return int(np.random.SeedSequence([int(seed), stream, int(index)]).generate_state(1)[0])


def _optimizer_tensors(model, opt) -> Dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        st = opt.state.get(p)
        if not st:
            continue
        out[f"{name}.exp_avg"] = st["exp_avg"]
        out[f"{name}.exp_avg_sq"] = st["exp_avg_sq"]
        out[f"{name}.step"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1)
    return out


def _restore_optimizer(model, opt, tensors: Dict[str, torch.Tensor], path) -> None:
    for name, p in model.named_parameters():
        try:
            opt.state[p] = {"step": tensors[f"{name}.step"].reshape(()).clone(),
                            "exp_avg": tensors[f"{name}.exp_avg"].clone(),
                            "exp_avg_sq": tensors[f"{name}.exp_avg_sq"].clone()}
        except KeyError as err:
            raise CheckpointError(f"{str(path)!r}: the optimizer file lacks {err.args[0]!r}; cannot resume exactly.")


def _quick_eval(model, task, n: int, seed: int) -> float:
    batch = task.sample(n, seed=seed)
    was = model.training
    model.eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.as_tensor(batch.tokens)).logits
    if was:
        model.train()
    h, _ = entropy_stats(logits.float(), batch)
    return position_mae_bits(h, batch.bayes_entropy_bits)


def train(task, config: Optional[TrainConfig] = None, steps: int = 2000, *, seed: int = 0, out=None,
          resume: bool = False, overwrite: bool = False, checkpoint_every: Optional[int] = None,
          eval_every: Optional[int] = None, n_eval_seqs: int = 500, threads: Optional[int] = None,
          stop_at: Optional[int] = None, extra: Optional[dict] = None,
          progress: Optional[bool] = None) -> TrainResult:
    """Train a wind-tunnel model on ``task`` for ``steps`` optimizer steps (CPU by default).

    Parameters
    ----------
    task: a task object (:class:`BijectionTask`, :class:`HMMTask`) or a name with default parameters.
    config: :class:`TrainConfig` (model shape + optimizer); the default is a 2-layer, width-64 Llama.
    steps: total optimizer steps (a resumed run continues up to this number).
    seed: seeds the initial weights and every training batch.
    out: checkpoint folder; written every ``checkpoint_every`` steps and at the end.
    resume: continue from the checkpoint in ``out`` (its task and config must match). With the same
        ``steps`` the continuation is exact; a larger ``steps`` extends the run, recomputing the
        cosine schedule for the new total from the current step on. When ``out`` holds no checkpoint
        yet the run starts at step 0 with a :class:`UserWarning` saying so (a job script that always
        passes ``resume=True`` works from its first run on; a mistyped ``out`` is not silent).
    overwrite: allow starting afresh over an existing checkpoint in ``out``.
    eval_every / n_eval_seqs: held-out MAE (bits) every so many steps on ``n_eval_seqs`` sequences.
    threads: torch CPU threads during training (restored afterwards).
    stop_at: stop (and checkpoint) after this many steps while keeping the learning-rate schedule of
        ``steps``: train in chunks and continue later with ``resume=True``.
    extra: JSON-safe notes stored in the checkpoint's config.json (the CLI records its command line).
    """
    task = make_task(task)
    config = TrainConfig() if config is None else config
    if not isinstance(config, TrainConfig):
        raise InvalidInputError(f"config must be a bl.windtunnel.TrainConfig, got {type(config).__name__}.")
    steps = check_positive_int(steps, "steps")
    seed = check_seed(seed)
    n_eval_seqs = check_int(n_eval_seqs, "n_eval_seqs", min=2)
    stop_at = check_int(stop_at, "stop_at", min=1, max=steps, allow_none=True)
    end = int(steps if stop_at is None else stop_at)
    eval_every = eval_every or max(1, steps // 20)
    mcfg = config.model_config(task)
    out = check_output_dir(out, "out") if out is not None else None  # a file as `out` fails here, not after training
    if out is not None and (out / "config.json").exists() and not (resume or overwrite):
        raise InvalidInputError(f"{str(out)!r} already holds a checkpoint; pass resume=True to continue it or "
                                "overwrite=True to start afresh.")
    if resume and out is None:
        raise InvalidInputError("resume=True continues the checkpoint in out=, but no out was given; pass the "
                                "checkpoint folder as out=.")
    if resume and not (out / "config.json").exists():
        warnings.warn(f"resume=True, but {str(out)!r} holds no checkpoint (no config.json) yet: starting a new run "
                      "at step 0.", UserWarning, stacklevel=2)

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        model = build_hf(mcfg, task.d_vocab, seed=int(seed))
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98), eps=1e-8,
                                weight_decay=config.weight_decay)
        start, history = 0, []
        if resume and out is not None and (out / "config.json").exists():
            ckpt = read_checkpoint(out)
            if ckpt.task != task or ckpt.model_config != mcfg or ckpt.seed != int(seed):
                raise CheckpointError(
                    f"{str(out)!r} holds a run of {ckpt.task!r}, {ckpt.model_config}, seed {ckpt.seed}; "
                    f"cannot resume it as {task!r}, {mcfg}, seed {seed}. Use another `out`.")
            if TrainConfig.from_dict(ckpt.train_config) != config:
                raise CheckpointError(f"{str(out)!r} was trained with {ckpt.train_config}; pass the same TrainConfig "
                                      "to resume.")
            model.load_state_dict(ckpt.weights, strict=False)
            if ckpt.optimizer is None:
                raise CheckpointError(f"{str(out)!r} has no optimizer state (shipped checkpoints omit it); "
                                      "it cannot be resumed exactly - train afresh with overwrite=True.")
            _restore_optimizer(model, opt, ckpt.optimizer, out)
            start, history = ckpt.step, list(ckpt.history)
            prev = {k: v for k, v in ckpt.extra.items() if k not in ("total_steps", "torch")}
            merged = {**prev, **(extra or {})}
            if "command" in prev and extra and "command" in extra:  # keep every command of a resumed run
                merged["commands"] = list(prev.get("commands") or [prev["command"]]) + [extra["command"]]
            extra = merged
        model.train()
        t0 = time.perf_counter()
        wall_before = float(history[-1].get("wall_s", 0.0)) if history else 0.0
        losses = []
        bar = progress_bar(range(start, end), desc=f"train {task.name}", total=max(0, end - start), enabled=progress,
                        unit="step")
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, steps, config)
            batch = task.sample(config.batch_size, seed=_batch_seed(seed, _TRAIN_STREAM, step))
            logits = model(input_ids=torch.as_tensor(batch.tokens)).logits[:, torch.as_tensor(batch.target_positions)]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     torch.as_tensor(batch.targets).reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            opt.step()
            losses.append(loss.detach().item())
            done = step + 1
            if done % eval_every == 0 or done == end:
                mae = _quick_eval(model, task, n_eval_seqs, _batch_seed(config.eval_seed, _EVAL_STREAM, 0))
                history.append({"step": done, "loss_nats": float(np.mean(losses)), "mae_bits": mae,
                                "wall_s": wall_before + time.perf_counter() - t0})
                losses = []
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(loss=f"{history[-1]['loss_nats']:.4f}", mae_bits=f"{mae:.4f}")
            if out is not None and ((checkpoint_every and done % checkpoint_every == 0) or done == end):
                _save(out, model, opt, task, mcfg, config, done, seed, history, steps, extra)
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(old_threads)
    import pandas as pd

    hist = pd.DataFrame(history, columns=["step", "loss_nats", "mae_bits", "wall_s"])
    final = float(hist["mae_bits"].iloc[-1]) if len(hist) else _quick_eval(
        model, task, n_eval_seqs, _batch_seed(config.eval_seed, _EVAL_STREAM, 0))
    return TrainResult(task=task, config=config, steps=max(end, start), seed=int(seed), final_mae_bits=final,
                       wall_s=float(hist["wall_s"].iloc[-1]) if len(hist) else 0.0, history=hist,
                       path=str(out) if out is not None else None, _weights=weights)


def _save(out, model, opt, task, mcfg, config, step, seed, history, steps, extra=None) -> None:
    weights = {k: v for k, v in model.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    ckpt = Checkpoint(task=task, model_config=mcfg, train_config=config.to_dict(), step=step, seed=int(seed),
                      weights=weights, optimizer=_optimizer_tensors(model, opt), history=history,
                      extra={**(extra or {}), "total_steps": int(steps), "torch": torch.__version__})
    write_checkpoint(out, ckpt, optimizer=True)
