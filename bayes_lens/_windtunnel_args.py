"""The ``bayes-lens windtunnel train|eval`` argument definitions, importable without torch.

``bayes-lens windtunnel --help`` (and ``windtunnel train --help``) must answer from argparse
alone; importing :mod:`bayes_lens.windtunnel` loads torch, so the options live here and the
commands themselves (:func:`bayes_lens.windtunnel.cli.run_command`) are handed in by the caller, imported only
when one runs.
"""

from __future__ import annotations

import argparse

from ._cli_text import DEVICE_HELP, KIND_HELP

__all__ = ["WINDTUNNEL_HELP", "add_windtunnel_parser"]

WINDTUNNEL_HELP = "train / evaluate wind-tunnel models (tasks with exact posteriors)"


def add_windtunnel_parser(sub, run) -> argparse.ArgumentParser:
    """Register ``windtunnel train|eval`` on an argparse sub-parsers object; ``run(args)`` runs a parsed command (the
    caller passes :func:`bayes_lens.windtunnel.cli.run_command`, or a function that imports it when called: this
    module imports nothing of the wind tunnel, so the parser builds without torch)."""
    wt = sub.add_parser("windtunnel", help=WINDTUNNEL_HELP,
                        description="Wind tunnels (METHODS.md §11): small transformers trained on tasks whose "
                        "Bayes posterior is exact. `train` writes a checkpoint folder; `eval` prints the entropy "
                        "error (bits) of a shipped or trained checkpoint against the exact posterior.")
    wsub = wt.add_subparsers(dest="wt_command", required=True, metavar="{train,eval}")
    p = wsub.add_parser("train", help="train a wind-tunnel model (on the CPU) and write a checkpoint folder",
                        description="Train a small Llama-style model on a wind-tunnel task on the CPU and write a "
                        "checkpoint folder (safetensors + JSON), resumable with --resume.")
    p.add_argument("--task", choices=["bijection", "hmm"], required=True, help="the task to learn (required)")
    p.add_argument("--V", type=int, default=None, help="symbols (default: 10 for bijection, 5 for hmm)")
    p.add_argument("--S", type=int, default=5, help="hmm only: hidden states (default: 5)")
    p.add_argument("--K", type=int, default=20, help="hmm only: observations per sequence (default: 20)")
    p.add_argument("--Q", type=int, default=8, help="hmm only: probabilities are multiples of 1/Q (default: 8)")
    p.add_argument("--alpha", type=float, default=0.5, help="hmm only: Dirichlet concentration (default: 0.5)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers (default: 2)")
    p.add_argument("--d-model", type=int, default=64, help="residual width (default: 64)")
    p.add_argument("--heads", type=int, default=4, help="attention heads per layer (default: 4)")
    p.add_argument("--d-head", type=int, default=16, help="width of each head (default: 16)")
    p.add_argument("--d-mlp", type=int, default=0, help="MLP width (default: 0, meaning 4 x --d-model)")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per optimizer step (default: 64)")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="peak AdamW learning rate, then a cosine down to 0.1 x lr (default: 0.001)")
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps (default: 100)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default: 0.0)")
    p.add_argument("--steps", type=int, default=2000,
                   help="total optimizer steps; a resumed run continues up to this number (default: 2000)")
    p.add_argument("--seed", type=int, default=0, help="seeds the initial weights and every batch (default: 0)")
    p.add_argument("--out", required=True, help="checkpoint folder to write (required)")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out (default: off)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh over an existing checkpoint in --out (default: off: refuse)")
    p.add_argument("--checkpoint-every", type=int, default=500, help="write the checkpoint every N steps (default: 500)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="evaluate the held-out error every N steps (default: steps // 20)")
    p.add_argument("--eval-n", type=int, default=500, help="held-out sequences per evaluation (default: 500)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    p.set_defaults(func=run)
    p = wsub.add_parser("eval", help="entropy error (bits) of a checkpoint against the exact posterior",
                        description="Print Paper I's entropy error (bits) of a shipped or trained checkpoint "
                        "against the exact posterior, per position, with a bootstrap interval.")
    p.add_argument("--checkpoint", default="bijection",
                   help="'bijection' or 'hmm' (shipped), or a folder written by `train` (default: bijection)")
    p.add_argument("--kind", default="auto", choices=["auto", "hooked", "bridge"],
                   help=KIND_HELP + " (default: auto)")
    p.add_argument("--device", default="auto",
                   help=DEVICE_HELP + " (default: auto)")
    p.add_argument("--n", type=int, default=1000, help="fresh sequences to evaluate (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="seeds the sequences (and --untrained's weights) (default: 0)")
    p.add_argument("--untrained", action="store_true",
                   help="evaluate a same-shape untrained model instead (default: off)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (default: a table)")
    p.set_defaults(func=run)
    return wt
