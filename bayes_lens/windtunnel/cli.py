"""Command line for wind tunnels: ``bayes-lens windtunnel train|eval``.

``train`` trains a model on a task (METHODS.md §11) and writes a checkpoint folder (safetensors +
JSON); ``eval`` prints Paper I's entropy error (bits) of a shipped or trained checkpoint against the
exact posterior, per position. The lead CLI registers these with :func:`add_subparsers`;
:func:`bayes_lens.cli.windtunnel_main` runs them standalone (``python -m bayes_lens.windtunnel ...``);
this module never imports :mod:`bayes_lens.cli` (no import cycle).

Example
-------
::

    bayes-lens windtunnel train --task bijection --V 10 --steps 6000 --out runs/bij
    bayes-lens windtunnel eval --checkpoint bijection --n 2000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_subparsers"]


def _task_from_args(args):
    from .tasks import make_task

    if args.task == "bijection":
        return make_task("bijection", V=args.V if args.V is not None else 10)
    return make_task("hmm", S=args.S, V=args.V if args.V is not None else 5, K=args.K, Q=args.Q, alpha=args.alpha)


def _command_line(args) -> str:
    own = getattr(args, "argv_", None)  # set by bayes_lens.cli.main
    return "bayes-lens " + " ".join(sys.argv[1:] if own is None else own)


def _cmd_train(args) -> int:
    from .train import TrainConfig, train

    task = _task_from_args(args)
    cfg = TrainConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads, d_head=args.d_head,
                      d_mlp=args.d_mlp if args.d_mlp else 4 * args.d_model, batch_size=args.batch_size, lr=args.lr,
                      warmup=args.warmup, weight_decay=args.weight_decay)
    resume = args.resume
    if resume and args.out is not None and not (Path(args.out) / "config.json").exists():
        # a job script that always passes --resume starts fresh the first time; say so (a mistyped --out shows)
        print(f"bayes-lens: --resume: {args.out!r} holds no checkpoint yet; starting a new run at step 0",
              file=sys.stderr)
        resume = False
    run = train(task, cfg, steps=args.steps, seed=args.seed, out=args.out, resume=resume,
                overwrite=args.overwrite, checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
                eval_n=args.eval_n, threads=args.threads,
                extra={"command": _command_line(args)})
    print(run.history.to_string(index=False))
    print(f"task {task!r}: final MAE {run.final_mae_bits:.5f} bits after {run.steps} steps "
          f"({run.wall_s:.1f} s of training); checkpoint: {run.path}")
    return 0


def _cmd_eval(args) -> int:
    from . import evaluate, load, untrained

    if args.untrained:
        model, task = untrained(args.checkpoint, seed=args.seed, kind=args.kind)
    else:
        model, task = load(args.checkpoint, kind=args.kind)
    res = evaluate(model, task, n=args.n, seed=args.seed)
    if args.json:
        print(json.dumps({k: v for k, v in res.to_dict().items()
                          if k not in ("model_entropy_bits", "bayes_entropy_bits")}, indent=1))
        return 0
    print(res.table.to_string(index=False, float_format=lambda x: f"{x:.5f}"))
    print(f"{task!r} ({'untrained' if args.untrained else args.checkpoint}): MAE {res.mae_bits:.5f} bits "
          f"[95% CI {res.mae_ci[0]:.5f}, {res.mae_ci[1]:.5f}], per-sequence {res.seq_mae_bits:.5f} bits, "
          f"KL {res.kl_bits:.5f} bits, n = {res.n}")
    return 0


def _fill(wt: argparse.ArgumentParser) -> None:
    sub = wt.add_subparsers(dest="wt_command", required=True)
    p = sub.add_parser("train", help="train a wind-tunnel model and write a checkpoint folder")
    p.add_argument("--task", choices=["bijection", "hmm"], required=True)
    p.add_argument("--V", type=int, default=None, help="symbols (bijection default 10, hmm default 5)")
    p.add_argument("--S", type=int, default=5, help="hmm: hidden states (default 5)")
    p.add_argument("--K", type=int, default=20, help="hmm: observations per sequence (default 20)")
    p.add_argument("--Q", type=int, default=8, help="hmm: probabilities are multiples of 1/Q (default 8)")
    p.add_argument("--alpha", type=float, default=0.5, help="hmm: Dirichlet concentration (default 0.5)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-head", type=int, default=16)
    p.add_argument("--d-mlp", type=int, default=0, help="default 4 x d_model")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="checkpoint folder")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument("--overwrite", action="store_true", help="start afresh over an existing checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--eval-n", type=int, default=500)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(func=_cmd_train)
    p = sub.add_parser("eval", help="entropy error (bits) of a checkpoint against the exact posterior")
    p.add_argument("--checkpoint", default="bijection", help="'bijection', 'hmm' (shipped) or a folder")
    p.add_argument("--kind", default="auto", choices=["auto", "hooked", "bridge"])
    p.add_argument("--n", type=int, default=1000, help="fresh sequences (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--untrained", action="store_true", help="evaluate a same-shape untrained model instead")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_eval)


def add_subparsers(sub) -> argparse.ArgumentParser:
    """Register ``windtunnel train|eval`` on an ``argparse`` sub-parsers object; sets ``func``."""
    wt = sub.add_parser("windtunnel", help="train / evaluate wind-tunnel models (tasks with exact posteriors)")
    _fill(wt)
    return wt
