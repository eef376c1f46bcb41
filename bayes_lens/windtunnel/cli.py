"""Command line for wind tunnels: ``bayes-lens windtunnel train|eval``.

``train`` trains a model on a task (METHODS.md §11) and writes a checkpoint folder (safetensors +
JSON); ``eval`` prints Paper I's entropy error (bits) of a shipped or trained checkpoint against the
exact posterior, per position. The options are defined in :mod:`bayes_lens._windtunnel_args` (no
torch import, so ``--help`` is instant); the lead CLI registers them with :func:`bayes_lens._windtunnel_args.add_windtunnel_parser`;
:func:`bayes_lens.cli.windtunnel_main` runs them standalone (``python -m bayes_lens.windtunnel ...``);
this module never imports :mod:`bayes_lens.cli` (no import cycle; ``python -m bayes_lens.windtunnel`` neither).

Example
-------
::

    bayes-lens windtunnel train --task bijection --V 10 --steps 6000 --out runs/bij
    bayes-lens windtunnel eval --checkpoint bijection --n 2000
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

__all__ = ["run_command"]


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
                n_eval_seqs=args.eval_n, threads=args.threads,
                extra={"command": _command_line(args)})
    print(run.history.to_string(index=False))
    print(f"task {task!r}: final MAE {run.final_mae_bits:.5f} bits after {run.steps} steps "
          f"({run.wall_s:.1f} s of training); checkpoint: {run.path}")
    return 0


def _cmd_eval(args) -> int:
    from .._validate import check_device
    from . import evaluate, load, untrained

    device = check_device(getattr(args, "device", None), "--device")  # 'auto': CUDA when present
    # TransformerLens prints "Moving model to device" on stdout; keep stdout for the result (--json parses)
    with contextlib.redirect_stdout(sys.stderr):
        if args.untrained:
            model, task = untrained(args.checkpoint, seed=args.seed, kind=args.kind, device=device)
        else:
            model, task = load(args.checkpoint, kind=args.kind, device=device)
        res = evaluate(model, task, n_seqs=args.n, seed=args.seed)
    if args.json:
        print(json.dumps({k: v for k, v in res.to_dict().items()
                          if k not in ("model_entropy_bits", "bayes_entropy_bits")}, indent=1))
        return 0
    print(res.table.to_string(index=False, float_format=lambda x: f"{x:.5f}"))
    print(f"{task!r} ({'untrained' if args.untrained else args.checkpoint}): MAE {res.mae_bits:.5f} bits "
          f"[95% CI {res.mae_bits.ci_low:.5f}, {res.mae_bits.ci_high:.5f}], per-sequence {res.seq_mae_bits:.5f} bits, "
          f"KL {res.kl_bits:.5f} bits, n = {res.n}")
    return 0


def run_command(args) -> int:
    """Run the parsed ``windtunnel train|eval`` command (the parser is :mod:`bayes_lens._windtunnel_args`)."""
    return {"train": _cmd_train, "eval": _cmd_eval}[args.wt_command](args)

