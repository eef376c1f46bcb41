"""Wind tunnels: small transformers trained on tasks with exact posteriors (METHODS.md §11).

Paper A Part I ("The Bayesian Geometry of Transformer Attention", arXiv 2512.22471) calibrates
the Bayesian-geometry metrics on "wind tunnels": transformers trained on tasks whose Bayes-optimal
predictive is known in closed form, where the geometry should be clean. This package provides

* the tasks, with seeded batched generators and exact posteriors: :class:`BijectionTask`
  (Bayes entropy before y_k is log2(V − k + 1)) and :class:`HMMTask` (forward algorithm, the HMM's
  parameters written in the prompt);
* :func:`train` (CPU, progress bar, safetensors + JSON checkpoints, resumable) and the command
  line ``bayes-lens windtunnel train|eval`` (``python -m bayes_lens.windtunnel``);
* :func:`evaluate`: Paper I's entropy error in bits against the exact posterior;
* :func:`load`: the shipped checkpoints ``"bijection"`` and ``"hmm"`` as TransformerLens models
  (``HookedTransformer`` on TL 3.x, ``TransformerBridge`` on both), and :func:`untrained` for a
  same-shape random model;
* :func:`task_prompts`: task prefixes as task items (METHODS.md §6a) with the exact posterior over the
  answer symbols, for :func:`bayes_lens.localize` and :func:`bayes_lens.sula.evaluate`;
  :func:`hypothesis_frame` the answer symbols' embedding span (the wind tunnel's "hypothesis frame",
  METHODS.md §13), a basis for ``localize``'s ``bases=``;
* :func:`compare`: the geometry suite (value manifold, key orthogonality, attention focusing,
  alignment with the *exact* Bayes entropy) on a trained vs an untrained model, next to Paper A's
  wind-tunnel reference (PC1+PC2 84–95%, key orthogonality 0.09–0.12, focusing 85–90%).

Example
-------
>>> import bayes_lens as bl
>>> model, task = bl.windtunnel.load("bijection")                         # doctest: +SKIP
>>> bl.windtunnel.evaluate(model, task, n_seqs=1000, seed=0).mae_bits           # doctest: +SKIP
>>> base, _ = bl.windtunnel.untrained("bijection", seed=0)                  # doctest: +SKIP
>>> bl.windtunnel.compare(model, base, task).table                          # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from .._namespace import import_submodule, package_dir
from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .evaluate import WindTunnelEval, evaluate
from .model import ModelConfig, hypothesis_frame, to_tl
from .tasks import Batch, BijectionTask, HMMTask, hmm_forward, make_task
from .train import TrainConfig, TrainResult, train

__all__ = [
    "BijectionTask", "HMMTask", "Batch", "make_task", "hmm_forward",
    "ModelConfig", "TrainConfig", "TrainResult", "train",
    "WindTunnelEval", "evaluate",
    "load", "untrained", "shipped_path", "SHIPPED",
    "compare", "WindTunnelComparison", "task_prompts", "geometry_prompts", "hypothesis_frame",
    "Checkpoint", "read_checkpoint", "write_checkpoint",
]

SHIPPED = ("bijection", "hmm")
_DATA = Path(__file__).resolve().parent.parent / "data" / "windtunnel"


def shipped_path(name: str) -> Path:
    """The folder of a shipped checkpoint (``"bijection"`` or ``"hmm"``)."""
    from ..errors import CheckpointError, InvalidInputError

    if name not in SHIPPED:
        raise InvalidInputError(f"unknown wind-tunnel checkpoint {name!r}; shipped ones are {list(SHIPPED)} "
                                "(or pass the path of a folder written by bl.windtunnel.train).")
    path = _DATA / name
    if not (path / "config.json").is_file():
        raise CheckpointError(f"the shipped checkpoint {name!r} is missing from {str(path)!r}; reinstall bayes-lens.")
    return path


def _resolve(name_or_path) -> Path:
    if isinstance(name_or_path, (str, Path)) and str(name_or_path) in SHIPPED:
        return shipped_path(str(name_or_path))
    if isinstance(name_or_path, (str, Path)):
        return Path(name_or_path)
    from ..errors import InvalidInputError

    raise InvalidInputError(f"expected a shipped checkpoint name {list(SHIPPED)} or a folder path, got {name_or_path!r}.")


def load(name="bijection", kind: str = "auto", *, device=None):
    """A trained wind-tunnel model and its task: ``(model, task)``.

    ``name`` is ``"bijection"`` or ``"hmm"`` (shipped checkpoints) or the folder of a checkpoint
    written by :func:`train`. ``kind`` is ``"hooked"`` (TL 3.x), ``"bridge"`` or ``"auto"``.
    Raises :class:`~bayes_lens.errors.CheckpointError` for a missing or corrupted checkpoint.
    """
    from .._validate import check_device

    device = check_device(device)
    ckpt = read_checkpoint(_resolve(name), optimizer=False)
    model = to_tl(ckpt.weights, ckpt.model_config, ckpt.task.vocab, kind, name=f"windtunnel-{ckpt.task.name}",
                  device=device)
    return model, ckpt.task


def untrained(name="bijection", kind: str = "auto", *, seed: int = 0, device=None):
    """An untrained model of the same shape as checkpoint ``name`` (Hugging Face init, seeded): ``(model, task)``."""
    from .._validate import check_device, check_seed
    from .model import random_weights

    device, seed = check_device(device), check_seed(seed)
    ckpt = read_checkpoint(_resolve(name), optimizer=False)
    weights = random_weights(ckpt.model_config, ckpt.task.d_vocab, seed=seed)
    model = to_tl(weights, ckpt.model_config, ckpt.task.vocab, kind, name=f"windtunnel-{ckpt.task.name}-untrained",
                  device=device)
    return model, ckpt.task


def __getattr__(name):  # compare needs the geometry suite; import it on first use
    if name in ("compare", "WindTunnelComparison", "task_prompts", "geometry_prompts"):
        from . import comparison

        return getattr(comparison, name)
    return import_submodule(globals(), name)  # cli, model, tasks ...: public modules imported on first use


__dir__ = package_dir(globals())
