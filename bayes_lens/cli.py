"""The ``bayes-lens`` command line.

Sub-commands (each has ``--help``): ``models`` lists what is installed and loadable offline;
``info`` loads a model and prints its facts and a short greedy generation. The analysis
sub-commands (report, geometry, sula, ablate, martingale) are registered here too as they land.
Bad input exits with status 2 and a one-line message (never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .errors import BayesLensError

__all__ = ["main"]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="'default' (SmolLM2-135M-Instruct, offline), a .gguf file, or a local HF folder")
    p.add_argument("--kind", default="auto", choices=["auto", "hooked", "bridge"], help="TransformerLens model kind")
    p.add_argument("--device", default=None, help="torch device (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _cmd_models(args) -> int:
    from . import adapter
    from .models import available_models

    print(f"TransformerLens HookedTransformer available: {adapter.has_hooked_transformer()}")
    for name, where in available_models().items():
        print(f"{name:10s} {where}")
    print("Also accepted by --model: a path to a llama-architecture .gguf file, or a local Hugging Face folder.")
    return 0


def _cmd_info(args) -> int:
    import torch

    from . import adapter
    from .models import load_model

    model = load_model(args.model, kind=args.kind, device=args.device)
    info = adapter.model_info(model)
    for key, value in info.__dict__.items():
        print(f"{key:12s} {value}")
    prompt = args.prompt
    tokens, _ = adapter.tokenize(model, [prompt])
    with torch.inference_mode():
        for _ in range(args.max_new_tokens):
            nxt = model(tokens)[0, -1].argmax()
            tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    print(f"greedy continuation: {model.tokenizer.decode(tokens[0].tolist())!r}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bayes-lens", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("models", help="list the models installed and loadable offline")
    p.set_defaults(func=_cmd_models)
    p = sub.add_parser("info", help="load a model, print its facts and a short greedy generation")
    _add_model_args(p)
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.set_defaults(func=_cmd_info)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BayesLensError as err:
        print(f"bayes-lens: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bayes-lens: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
