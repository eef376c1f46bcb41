"""bayes-lens: measure whether a TransformerLens model carries, and uses, Bayesian geometry.

Sub-commands (each has ``--help``):

* ``report``      - everything: geometry, SULA, ablation, martingale -> ``OUT/report.html`` + ``report.json``
* ``geometry``    - only the geometry section (value manifold, keys, focusing, alignment, domains)
* ``sula``        - only SULA calibration with its controls
* ``ablate``      - SULA, then the entropy-axis ablation comparison
* ``martingale``  - only the martingale diagnostics
* ``localize``    - SULA, then readout or mediator: cross-fitted readouts and subspace removals per layer
* ``reproduce``   - ``paper-a`` / ``paper-b`` / ``falck``: the paper's headline numbers, ours, the band and a verdict
  per row: PASS / FAIL against a paper's own number (the papers' models), MATCHES RECORD / DIFFERS FROM RECORD
  against bayes_lens's own recorded run (the offline models), or NOT COMPARABLE (Paper A: the released code's
  proxies beside the true definitions)
* ``steering``    - steering as a prior: does a direction shift the prior or reweight the evidence (METHODS.md §16)
* ``codelength``  - Paper B v3: excess code length against the exact Dirichlet/KT reference and the plug-in
* ``windtunnel``  - ``train`` / ``eval`` the small wind-tunnel models (when that package is installed)
* ``shard``       - sharded runs: ``plan`` / ``run`` (torchrun, SLURM, any runner) / ``merge`` / ``status``
* ``models``      - what is installed and loadable offline; ``info`` - a model's facts

The analysis commands share ``--model`` (``default``, ``gemma-3-270m``, a ``.gguf`` file or a local Hugging Face
folder), ``--out``, ``--seed``, ``--quick``, ``--device`` (default ``auto``: CUDA when present); they show progress bars, print a summary
table at the end, and write a report folder (``report.json``, ``report.html``, ``tables/``).

Exit status: 0 success; 1 the report was written but a section failed (see the report);
2 bad input (unknown model, unwritable output folder, bad option) with a one-line message, never a
traceback; 130 interrupted (an existing report is left untouched).

Example
-------
$ bayes-lens report --quick --out report/
$ bayes-lens sula --model path/to/model.gguf --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import time
from typing import List, Optional

from ._entry import guarded
from ._cli_text import DEVICE_HELP, KIND_HELP, MODEL_HELP, MODEL_NAMES
from ._validate import check_device, check_output_dir
from ._windtunnel_args import add_windtunnel_parser
from .errors import InvalidInputError
from .shard.cli import add_subparsers as add_shard

__all__ = ["main", "build_parser", "package_version"]

# Nothing heavy (torch, TransformerLens, the analyses) is imported at module level: ``--help`` and
# ``--version`` answer from argparse alone; each command imports what it needs when it runs.


def package_version() -> str:
    """The installed distribution's version (``importlib.metadata``; no torch import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bayes-lens")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that is not installed
        return "unknown (not installed)"

# command -> (report sections, default output folder, help)
_ANALYSES = {
    "report": (None, "report", "run every analysis and write a self-contained HTML + JSON report"),
    "geometry": (["geometry"], "report-geometry",
                 "value manifold, key orthogonality, attention focusing, entropy alignment, domains"),
    "sula": (["sula"], "report-sula", "SULA calibration against the analytic Bayes posterior, with controls"),
    "ablate": (["sula", "ablation"], "report-ablate",
               "entropy-axis ablation (fit on SULA prompts) vs a random direction: geometry and calibration"),
    "martingale": (["martingale"], "report-martingale", "martingale gap on binary sequences (Paper B)"),
    "localize": (["sula", "localize"], "report-localize",
                 "readout or mediator: which subspaces read the Bayes entropy, which does calibration use"),
}

# the confidence mechanism (METHODS.md §15): one block, apart from the table above
_ANALYSES["confidence"] = (["confidence"], "report-confidence",
                           "the confidence mechanism: entropy neurons (W_U's null space, the final norm's scale) "
                           "and whether the entropy axis is the norm-temperature channel")


class _LazyVersion(argparse.Action):
    """``--version`` that reads the distribution's metadata only when asked: the lookup scans every
    installed package (0.5 s on a loaded machine), which every ``--help`` would otherwise pay."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"bayes-lens {package_version()}")
        print(transformer_lens_summary())
        parser.exit(0)


def transformer_lens_summary() -> str:
    """One line: the installed TransformerLens version, its major, and which model classes it has.

    Read from the distribution's metadata and its files, without importing TransformerLens (which
    imports torch): ``--version`` must answer at once. TransformerLens 3.x has ``HookedTransformer``
    (``transformer_lens/HookedTransformer.py``) and, from 3.4, ``TransformerBridge``
    (``transformer_lens/model_bridge/``); 4.x has only the bridge, so ``bl.load_model()`` returns one.
    """
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        tl = version("transformer-lens")
        spec = importlib.util.find_spec("transformer_lens")  # finds the package without executing it
    except (PackageNotFoundError, ImportError, ValueError):
        return "TransformerLens: not installed (pip install 'transformer-lens>=3.4,<5')"
    if spec is None or not spec.submodule_search_locations:
        return f"TransformerLens {tl}: installed, but its package folder was not found"
    where = Path(list(spec.submodule_search_locations)[0])
    hooked = (where / "HookedTransformer.py").is_file()
    bridge = (where / "model_bridge").is_dir()
    major = tl.split(".")[0]

    def yes(flag):
        return "yes" if flag else "no"

    return (f"TransformerLens {tl} (major {major}): HookedTransformer {yes(hooked)}, TransformerBridge {yes(bridge)}"
            f"; bl.load_model() returns a {'HookedTransformer' if hooked else 'TransformerBridge'} by default")


_INVALID_CHOICE = re.compile(r"invalid choice: (?P<word>'[^']*'|\S+) \(choose from (?P<choices>.*)\)")
_UNRECOGNIZED = "unrecognized arguments: "


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``bayes-lens: error: ...``), exit status 2, and a "did you mean"
    for a misspelt sub-command, choice or option (Python 3.11's argparse has no ``suggest_on_error``)."""

    def parse_known_args(self, args=None, namespace=None):
        # kept for the suggestions: which sub-command's options an unrecognized --option is compared with
        self._argv_ = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):  # noqa: D401 - argparse API
        hint, prog = self._suggestion(message)
        self.exit(2, f"bayes-lens: error: {message}{hint} (see `{prog} --help`)\n")

    def _suggestion(self, message):
        """``("; did you mean ...?", the prog whose --help lists the right options)``."""
        if "did you mean" in message or "maybe you meant" in message:  # argparse >= 3.14 says it itself
            return "", self.prog
        m = _INVALID_CHOICE.search(message)
        if m:
            word = m.group("word").strip("'")
            choices = [c.strip().strip("'") for c in m.group("choices").split(",")]
            close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
            return (f"; did you mean {close[0]!r}?" if close else ""), self.prog
        if message.startswith(_UNRECOGNIZED):
            parser = self._command_parser()
            options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
            hints = []
            for word in message[len(_UNRECOGNIZED):].split():
                flag = word.split("=", 1)[0]
                close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6) if flag.startswith("-") else []
                if close:
                    hints.append((close[0], flag))
            if len(hints) == 1:
                return f"; did you mean {hints[0][0]!r}?", parser.prog
            said = ", ".join(f"{good!r} (for {bad!r})" for good, bad in hints)
            return (f"; did you mean {said}?" if hints else ""), parser.prog
        return "", self.prog

    def _command_parser(self) -> argparse.ArgumentParser:
        """The (sub-)parser the command line reached: ``report`` in ``bayes-lens report --quik``."""
        parser = self
        for word in getattr(self, "_argv_", []):
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if subs and word in subs[0].choices:
                parser = subs[0].choices[word]
        return parser


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help=MODEL_HELP + " (default: default)")
    p.add_argument("--kind", default="auto", choices=["auto", "hooked", "bridge"], help=KIND_HELP + " (default: auto)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP + " (default: auto)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="random seed (default: 0)")
    p.set_defaults(check_model_name_=True)   # main() checks --model's name before the command imports torch


def check_model_name(name: str) -> None:
    """Refuse a ``--model`` that is neither a named offline model nor a path, before anything imports torch
    (importing torch and TransformerLens took 27 s under load just to say the name is unknown).

    A path that exists, or one ending in ``.gguf`` (whose loader says "not found" itself), passes; the
    loader still checks everything else.
    """
    from pathlib import Path

    from .errors import ModelLoadError

    text = str(name)
    if text in MODEL_NAMES or Path(text).expanduser().exists() or text.endswith(".gguf") or not text.strip():
        return   # an empty name: the loader's own message
    hint = ""
    close = difflib.get_close_matches(text, MODEL_NAMES, n=1, cutoff=0.6)
    if close:
        hint = f"; did you mean {close[0]!r}?"
    elif "smol" in text.lower():
        hint = "; SmolLM2-135M is 'default'"
    elif "gemma" in text.lower():
        hint = "; Gemma 3 270M is 'gemma-3-270m'"
    raise ModelLoadError(
        f"unknown model {text!r}{hint}: pass 'default', 'gemma-3-270m', a .gguf file or a local Hugging Face "
        "folder (no hub downloads happen here; see `bayes-lens models`).")


def _check_device(device: Optional[str]) -> None:
    check_device(device, "--device")


def _load(args):
    from .models import load_model

    from pathlib import Path

    import contextlib

    _check_device(args.device)
    if str(args.model) != "default" and not Path(args.model).exists():
        load_model(args.model, kind=args.kind, device=args.device)  # raises a one-line ModelLoadError
    t0 = time.perf_counter()  # load_model says "loading ..." itself (unless progress is off)
    # TransformerLens prints "Moving model to device" on stdout; stdout is for the results (the summary table)
    with contextlib.redirect_stdout(sys.stderr):
        model = load_model(args.model, kind=args.kind, device=args.device)
    seconds = time.perf_counter() - t0
    print(f"bayes-lens: model loaded in {seconds:.1f} s", file=sys.stderr, flush=True)
    return model, seconds


def _cmd_models(args) -> int:
    from .models import model_catalog

    print(transformer_lens_summary())
    for e in model_catalog():
        size = f"{e.size_bytes / 1e6:.0f} MB" if e.size_bytes else "-"
        print(f"{e.name:13s} {e.description}; {size}; licence: {e.licence}")
        print(f"{'':13s} {e.where}")
    print("Also accepted by --model: a path to a llama- or gemma3-architecture .gguf file, or a local Hugging "
          "Face folder.")
    return 0


def _parameter_counts(model):
    """``(as loaded, the checkpoint's weights, why they differ)``: :func:`bayes_lens.adapter.parameter_counts`."""
    from .adapter import parameter_counts

    return parameter_counts(model)


def _cmd_info(args) -> int:
    import torch

    from . import adapter

    model, _ = _load(args)
    info = adapter.model_info(model)
    for key, value in info.__dict__.items():
        print(f"{key:12s} {value}")
    loaded, weights, why = _parameter_counts(model)
    # both readings, always (README "Install as a pip user"): on TL 4.x's bridge they are equal, and saying so
    # is the answer to "why does sum(p.numel()) differ from what I read elsewhere?"
    print(f"{'parameters':12s} {weights:,} in the checkpoint's weights; {loaded:,} as loaded, "
          f"sum(p.numel() for p in model.parameters()) ({why or 'the same: no copies, no all-zero biases'})")
    tokens, _ = adapter.tokenize(model, [args.prompt])
    room = info.n_ctx - int(tokens.shape[1]) if info.n_ctx else None
    if room is not None and args.max_new_tokens > room:
        raise InvalidInputError(
            f"--max-new-tokens {args.max_new_tokens} does not fit: the prompt has {int(tokens.shape[1])} tokens and "
            f"the model's context is {info.n_ctx} tokens; pass --max-new-tokens {max(room, 0)} or less."
        )
    with torch.inference_mode():
        for _ in range(args.max_new_tokens):
            nxt = model(tokens)[0, -1].argmax()
            tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    print(f"greedy continuation: {model.tokenizer.decode(tokens[0].tolist())!r}")
    return 0


def summary_table(doc: dict) -> str:
    """The report's headline numbers as a plain-text table (printed at the end of every command)."""
    from .reporting import summary_table as table

    return table(doc)


def _cmd_analysis(args) -> int:
    from .reporting import SectionPrinter, prepare_report, run_model_report

    sections, _, _ = _ANALYSES[args.command]
    if args.command == "report" and args.sections is not None:  # '' or 'a,,b' are refused, as sections=[] is
        sections = [s.strip() for s in args.sections.split(",")]
        if "" in sections:
            raise InvalidInputError(f"--sections {args.sections!r} has an empty section name; pass comma-separated "
                                    "names, e.g. --sections geometry,sula (or leave --sections out for all).")
    out = args.out or _ANALYSES[args.command][1]
    # cheap checks first: a bad --out or --seed must not cost a model load
    chosen, _ = prepare_report(out, seed=args.seed, sections=sections, quick=args.quick, overrides=None)
    if args.engine != "local" and args.shard_dir is None:
        raise InvalidInputError(f"--engine {args.engine} runs shards: pass --shard-dir DIR, a folder every rank "
                                "reaches.")
    if args.shard_dir is not None:  # a shard folder that cannot be written must fail now, not after the run
        check_output_dir(args.shard_dir, "--shard-dir")
    if args.no_progress:
        os.environ["BAYES_LENS_PROGRESS"] = "0"
    model, load_s = _load(args)
    on_section = SectionPrinter([s.name for s in chosen])   # with the sections the named ones need

    scaled = contextlib.nullcontext(model)
    if args.shard_dir is not None:  # the same runner-level scaling the library offers: bl.shard.sharded
        from .shard import sharded

        scaled = sharded(model, engine=args.engine, shard_dir=args.shard_dir)
    with scaled as run_model:
        doc = run_model_report(run_model, out, quick=args.quick, seed=args.seed, progress=not args.no_progress,
                               sections=sections, strict=args.strict, overrides=None, source=args.model,
                               extra_timings={"model_load": load_s}, on_section=on_section)
    print(summary_table(doc))
    print(f"\nreport: {os.path.join(out, 'report.html')}  (data: {os.path.join(out, 'report.json')}, "
          f"tables: {os.path.join(out, 'tables')}/)  total {doc['timings_s']['total']:.0f} s")
    failed = [n for n, s in doc["sections"].items() if s["status"] != "ok"]
    if failed:
        print(f"bayes-lens: section(s) {failed} failed; the report records why", file=sys.stderr)
        return 1
    return 0


def _cmd_codelength(args) -> int:
    import json
    from pathlib import Path

    from ._results import jsonable
    from ._validate import check_output_dir
    from .martingale import CategoricalTemplate, codelength, order_averaging

    out = check_output_dir(args.out, "--out") if args.out else None  # before the model load
    template = CategoricalTemplate.digits(args.symbols)  # checks 2 <= symbols <= 10 before the model load
    if args.no_progress:
        os.environ["BAYES_LENS_PROGRESS"] = "0"
    model, _ = _load(args)
    res = codelength(model, n_symbols=args.symbols, alpha=args.alpha, seq_len=args.seq_len, n_seqs=args.n_seqs,
                     template=template, seed=args.seed, n_boot=args.n_boot, identity_len=args.identity_len,
                     progress=not args.no_progress)
    print(repr(res))
    print(res.identity_line)
    oa = None
    if args.order_averaging:
        oa = order_averaging(model, n_symbols=args.symbols, alpha=args.alpha, ns=(args.seq_len // 4, args.seq_len // 2,
                             args.seq_len), n_seqs=min(args.n_seqs, 16), n_perms=8, template=template, seed=args.seed,
                             n_boot=args.n_boot, progress=not args.no_progress)
        print(repr(oa))
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        res.per_position.to_csv(Path(out) / "codelength_per_position.csv", index=False)
        doc = {"codelength": {"headline": jsonable(res.headline.to_dict("records")),
                              "identity_exact": res.identity_exact, "identity_line": res.identity_line,
                              "design": jsonable(res.design)}}
        if oa is not None:
            doc["order_averaging"] = {"per_n": jsonable(oa.per_n.to_dict("records")), "slopes": oa.slopes}
        (Path(out) / "codelength.json").write_text(json.dumps(doc, indent=1))
        print(f"written: {out}/codelength.json, {out}/codelength_per_position.csv")
    return 0


def _check_output_file(path, name: str):
    """An output file that can be written: not a folder, and its nearest existing folder writable (checked
    before minutes of work; nothing is created)."""
    from ._validate import check_path

    p = check_path(path, name, kind="file")
    parent = p.parent
    while not parent.exists() and parent.parent != parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InvalidInputError(f"{name} {str(p)!r} cannot be written: {str(parent)!r} is a file, not a folder; "
                                "pass a path in a folder (it is created if missing).")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{name} {str(p)!r} cannot be written: the folder {str(parent)!r} does not allow "
                                "writing (read-only, or not yours); pass a path in a folder you can write to.")
    return p


def _cmd_reproduce(args) -> int:
    from ._files import make_dir, write_text
    from ._validate import check_choice
    from .reproduction import PAPERS, SIZES, load_records

    check_choice(args.paper, "paper", PAPERS)
    check_choice(args.sizes, "--sizes", tuple(SIZES))
    # before the model load and the minutes of measuring: where the CSV goes, and the recorded runs
    csv = _check_output_file(args.csv, "--csv") if args.csv else None
    records = load_records()
    if args.no_progress:
        os.environ["BAYES_LENS_PROGRESS"] = "0"
    model, _ = _load(args)
    from .reproduction import reproduce

    res = reproduce(model, args.paper, sizes=args.sizes, seed=args.seed, progress=not args.no_progress,
                    records=records)
    print(res.table())
    if csv is not None:
        text = res.to_dataframe().to_csv(index=False)
        make_dir(csv.parent, "folder of --csv")
        write_text(csv, text)   # atomic, as the report's files: the old file or the new one, never a part
        print(f"written: {csv}")
    return 0


def windtunnel_main(argv: Optional[List[str]] = None) -> int:
    """Run ``windtunnel train|eval`` with ``argv`` (without the leading "windtunnel"); returns the exit code.

    The same as ``main(["windtunnel", *argv])``: one place handles errors and exit codes.
    """
    return main(["windtunnel", *(sys.argv[1:] if argv is None else argv)])


def _run_windtunnel(args) -> int:
    from .windtunnel.cli import run_command

    return run_command(args)


# --- bayes-lens steering (METHODS.md §16): one block ------------------------------------------------------
def _float_list(text: str) -> List[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as -0.5,0,0.5, got {text!r}") from None


def _layer_arg(text: str):
    if text == "middle":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'middle' or a layer index, got {text!r}") from None


def _add_steering_parser(sub) -> None:
    help_text = ("steering as a prior: steer by α along the label contrast, the entropy axis and controls; fit the "
                 "answer log-odds on α, the exact evidence LLR_Bayes and their product; does the direction shift the "
                 "prior or reweight the evidence?")
    p = sub.add_parser("steering", help=help_text, description=help_text)
    _add_model_args(p)
    p.add_argument("--task", default="sula", choices=["sula", "categorical"], help="the task (default: sula)")
    p.add_argument("--layer", type=_layer_arg, default="middle", help="layer to steer at (default: middle)")
    p.add_argument("--site", default="resid_post", choices=["resid_post", "v", "z"], help="site (default: resid_post)")
    p.add_argument("--alphas", type=_float_list, default=None,
                   help="comma-separated strengths, 0 included, written with = since they start with a minus: --alphas=-0.5,0,0.5 "
                   "(default: -0.5,-0.25,0,0.25,0.5; --quick -0.5,0,0.5)")
    p.add_argument("--alpha-unit", default="norm", choices=["norm", "sigma", "raw"],
                   help="unit of α: the site's mean final-token norm, each direction's coordinate SD, or raw "
                   "(default: norm)")
    p.add_argument("--n-per-k", type=_nonneg_int, default=None, help="prompts per k (default: 25; --quick 12)")
    p.add_argument("--n-random", type=_nonneg_int, default=None, help="Haar directions (default: 5; --quick 2)")
    p.add_argument("--n-boot", type=_nonneg_int, default=1000, help="bootstrap resamples (default: 1000)")
    p.add_argument("--n-null", type=_nonneg_int, default=None,
                   help="null data sets per direction for the false-positive rates (default: 200; --quick 100)")
    p.add_argument("--quick", action="store_true", help="small sizes: a few minutes on 2 cores (default: off)")
    p.add_argument("--out", default=None, help="folder for steering.csv, steering_grid.csv, steering.json "
                   "(default: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: bars on)")
    p.set_defaults(func=_cmd_steering)


def _cmd_steering(args) -> int:
    import json
    from pathlib import Path

    from ._results import jsonable
    from ._validate import check_output_dir

    out = check_output_dir(args.out, "--out") if args.out else None  # before the model load
    quick = bool(args.quick)
    alphas = args.alphas if args.alphas is not None else ([-0.5, 0.0, 0.5] if quick else [-0.5, -0.25, 0.0, 0.25, 0.5])
    n_per_k = args.n_per_k if args.n_per_k is not None else (12 if quick else 25)
    n_random = args.n_random if args.n_random is not None else (2 if quick else 5)
    n_null = args.n_null if args.n_null is not None else (100 if quick else 200)
    if args.no_progress:
        os.environ["BAYES_LENS_PROGRESS"] = "0"
    import bayes_lens as bl

    model, _ = _load(args)
    ks = (0, 1, 2, 4, 8)
    items = (bl.sula.make_prompts(model, ks=ks, n_per_k=n_per_k, seed=args.seed) if args.task == "sula" else
             bl.tasks.categorical_prompts(model, n_symbols=3, ks=ks, n_per_k=n_per_k, seed=args.seed))
    res = bl.steering(model, items, layer=args.layer, site=args.site, alphas=alphas, alpha_unit=args.alpha_unit,
                      n_random=n_random, n_boot=args.n_boot, n_null=n_null, seed=args.seed,
                      progress=not args.no_progress)
    print(repr(res))
    print(f"rule: {res.rule}")
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        res.table.to_csv(Path(out) / "steering.csv", index=False)
        res.grid.to_csv(Path(out) / "steering_grid.csv", index=False)
        doc = {"steering": {"table": jsonable(res.table.to_dict("records")), "evidence_weight": res.evidence_weight.to_dict(),
                            "layer": res.layer, "site": res.site, "alphas": list(res.alphas),
                            "alpha_unit": res.alpha_unit, "rule": res.rule, "seconds": res.seconds}}
        (Path(out) / "steering.json").write_text(json.dumps(doc, indent=1))
        print(f"written: {out}/steering.json, {out}/steering.csv, {out}/steering_grid.csv")
    return 0


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The ``bayes-lens`` parser (``argv`` is accepted for compatibility and unused: building the parser
    imports no torch, so every ``--help`` answers from argparse alone)."""
    parser = _Parser(prog="bayes-lens", description=__doc__.splitlines()[0],
                     epilog="Run `bayes-lens COMMAND --help` for the options of a command.")
    parser.add_argument("--version", action=_LazyVersion, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (sections, default_out, help_text) in _ANALYSES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_model_args(p)
        p.add_argument("--out", default=None, help=f"output folder (default: {default_out}/)")
        p.add_argument("--quick", action="store_true",
                       help="small sizes: minutes instead of a quarter hour (default: off, full sizes)")
        p.add_argument("--no-progress", action="store_true", help="no progress bars (default: bars on)")
        p.add_argument("--strict", action="store_true",
                       help="stop at the first failing analysis instead of recording it in the report "
                       "(default: off)")
        p.add_argument("--shard-dir", default=None,
                       help="run every forward pass in checked, resumable shards in this folder (bl.shard.sharded; "
                       "a rerun resumes) (default: none, in this process without files)")
        p.add_argument("--engine", default="local", choices=["local", "torchrun"],
                       help="who runs the shards with --shard-dir: this process, or the ranks of "
                       "`torchrun ... -m bayes_lens.cli` (default: local)")
        if name == "report":
            p.add_argument("--sections", default=None,
                           help="comma-separated subset of geometry,sula,ablation,martingale,tasks,localize,"
                           "confidence,steering; a section adds the sections it needs (ablation and localize add "
                           "sula) (default: geometry,sula,ablation,martingale; tasks, localize, confidence and "
                           "steering are opt-in)")
        p.set_defaults(func=_cmd_analysis)
    # neither registration imports torch (the commands import what they need when they run)
    add_windtunnel_parser(sub, _run_windtunnel)
    add_shard(sub)
    help_text = ("Paper B v3: excess prequential code length and cumulative KL against the exact Dirichlet "
                 "(KT for 2 symbols) reference and the plug-in, with the identity checked exactly")
    p = sub.add_parser("codelength", help=help_text, description=help_text)
    _add_model_args(p)
    p.add_argument("--symbols", type=_nonneg_int, default=2, help="number of symbols K, 2 to 10 (default: 2)")
    p.add_argument("--alpha", type=float, default=0.5, help="symmetric Dirichlet prior parameter (default: 0.5, KT)")
    p.add_argument("--seq-len", type=_nonneg_int, default=32, help="symbols per sequence (default: 32)")
    p.add_argument("--n-seqs", type=_nonneg_int, default=64, help="sequences (default: 64)")
    p.add_argument("--n-boot", type=_nonneg_int, default=1000, help="bootstrap resamples, 0 for none (default: 1000)")
    p.add_argument("--identity-len", type=_nonneg_int, default=None,
                   help="length of the exact identity check over all K^n sequences, 0 skips (default: the largest "
                   "n with K^n <= 256)")
    p.add_argument("--order-averaging", action="store_true",
                   help="also the order-averaging decomposition at seq-len/4, /2, /1 (default: off)")
    p.add_argument("--out", default=None, help="folder for codelength.json and a per-position CSV (default: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: bars on)")
    p.set_defaults(func=_cmd_codelength)
    _add_steering_parser(sub)
    help_text = ("does my run match the paper? paper-a, paper-b or falck: the paper's value, ours, the band and a "
                 "verdict per row: PASS / FAIL against the paper's own number (Pythia-410M, Phi-2, Llama-3.2-1B), "
                 "MATCHES RECORD / DIFFERS FROM RECORD against bayes_lens's own earlier recorded run of the same "
                 "model (SmolLM2-135M, Gemma 3 270M: not a check against the paper), else NOT COMPARABLE (Paper A: "
                 "released-code proxies beside the true definitions)")
    p = sub.add_parser("reproduce", help=help_text, description=help_text)
    p.add_argument("paper", choices=["paper-a", "paper-b", "falck"], help="which paper's headline measurements")
    _add_model_args(p)
    p.add_argument("--sizes", default="quick", choices=["quick", "full"],
                   help="quick (the size of our recorded runs, which give the offline models' bands) or full "
                   "(default: quick)")
    p.add_argument("--csv", default=None, help="also write the rows to this CSV file (default: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: bars on)")
    p.set_defaults(func=_cmd_reproduce)
    p = sub.add_parser("models", help="list the models installed and loadable offline",
                       description="List the named offline models (installed or not) with their size, licence "
                       "and where they are; no model is loaded.")
    p.set_defaults(func=_cmd_models)
    p = sub.add_parser("info", help="load a model, print its facts and a short greedy generation",
                       description="Load a model and print its facts (layers, widths, parameter count, context) "
                       "and a short greedy continuation of --prompt: a quick check that it loads and talks.")
    _add_model_args(p)
    p.add_argument("--prompt", default="The capital of France is",
                   help="text to continue greedily (default: 'The capital of France is')")
    p.add_argument("--max-new-tokens", type=_nonneg_int, default=8,
                   help="greedy tokens to generate, at most the context minus the prompt (default: 8)")
    p.set_defaults(func=_cmd_info)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.argv_ = argv  # recorded by commands that write provenance (windtunnel train)

    def run():
        if getattr(args, "check_model_name_", False):
            check_model_name(args.model)
        return args.func(args)
    return guarded(run)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
