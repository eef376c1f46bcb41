"""``python -m bayes_lens.windtunnel train|eval ...`` (the same as ``bayes-lens windtunnel ...``): the wind tunnel's
own parser (:mod:`bayes_lens._windtunnel_args`) and commands, with the package's one-line errors and exit codes
(:func:`bayes_lens._entry.guarded`); it does not import the lead CLI."""

import argparse
import sys

from .._entry import guarded
from .._windtunnel_args import add_windtunnel_parser
from .cli import run_command

_parser = argparse.ArgumentParser(prog="bayes-lens")
add_windtunnel_parser(_parser.add_subparsers(dest="command", required=True), run_command)
_args = _parser.parse_args(["windtunnel", *sys.argv[1:]])
_args.argv_ = ["windtunnel", *sys.argv[1:]]
sys.exit(guarded(lambda: _args.func(_args)))
