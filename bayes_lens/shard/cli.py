"""``bayes-lens shard plan|run|merge|status``: sharded runs from the command line.

* ``plan DIR --prompts FILE`` writes the job (``plan.json``, ``prompts.jsonl``) into ``DIR``;
* ``run DIR`` runs shards of it: ``--shard I`` (e.g. ``$SLURM_ARRAY_TASK_ID``), or the shards of
  ``--rank R --world-size W`` (default: ``RANK``/``WORLD_SIZE`` from torchrun, or
  ``SLURM_PROCID``/``SLURM_NTASKS`` from srun; else every shard). Finished shards are skipped. The
  folder is data: a loader or read class other than bayes_lens's and TransformerLens's own runs only
  when named with ``--allow-loader MODULE:FUNCTION`` / ``--allow-read MODULE:CLASS`` (or
  ``BAYES_LENS_ALLOW_LOADERS`` / ``BAYES_LENS_ALLOW_READS``);
* ``merge DIR`` checks the shards and writes the merged reduced cache (``DIR/merged.safetensors``);
* ``status DIR`` lists finished and pending shards.

Defining the options imports nothing heavy (``bayes_lens.shard`` loads its submodules lazily), so
``bayes-lens shard --help`` answers without torch. ``run`` joins no process group (each worker only writes its shards), so any job runner can start
it; ``merge`` runs once all are done. A prompts FILE is ``.jsonl`` (a JSON string, or an object
with ``"prompt"`` or ``"text"``, per line) or plain text (one prompt per line).

Example
-------
$ bayes-lens shard plan jobs/a --prompts prompts.txt --value-layers all --attention --n-shards 8
$ sbatch --array=0-7 --wrap 'bayes-lens shard run jobs/a --shard $SLURM_ARRAY_TASK_ID'
$ bayes-lens shard merge jobs/a
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .._cli_text import DEVICE_HELP, KIND_HELP, MODEL_HELP
from ..errors import InvalidInputError

__all__ = ["add_subparsers", "read_prompts_file"]


def read_prompts_file(path) -> list:
    """Prompts from a ``.jsonl`` or plain-text file (see the module doc)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"no prompts file {str(path)!r}; pass --prompts FILE (.jsonl or one prompt a line).")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [ln for ln in text.splitlines() if ln.strip()]
    # JSON lines end at "\n" only: a JSON string may hold a raw U+2028 / U+2029 / U+0085, which splitlines splits on
    lines = [ln for ln in text.split("\n") if ln.strip()]
    out = []
    for i, ln in enumerate(lines, 1):
        try:
            obj = json.loads(ln)
        except ValueError:
            raise InvalidInputError(f"{str(path)!r} line {i} is not JSON.") from None
        if isinstance(obj, dict):
            obj = obj.get("prompt", obj.get("text"))
        if not isinstance(obj, str):
            raise InvalidInputError(f"{str(path)!r} line {i}: expected a string or an object with 'prompt'/'text'.")
        out.append(obj)
    return out


def _layers(text):
    if text is None:
        return ()
    if text == "all":
        return "all"
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or comma-separated integers, got {text!r}") from None


def _cmd_plan(args) -> int:
    from . import ModelSpec, plan, write_plan

    prompts = read_prompts_file(args.prompts)
    if args.loader:
        try:
            kwargs = json.loads(args.model_kwargs or "{}")
        except ValueError:
            raise InvalidInputError(f"--model-kwargs must be a JSON object, got {args.model_kwargs!r}.") from None
        spec = ModelSpec(args.loader, kwargs)
    else:
        kw = {"kind": args.kind}
        if args.device:
            kw["device"] = args.device
        spec = ModelSpec(str(args.model), kw)
    ckw = {"value_layers": args.value_layers, "resid_layers": args.resid_layers, "attention": args.attention,
           "attention_positions": args.attention_positions, "batch_size": args.batch_size,
           "padding_side": args.padding_side}
    if args.token_ids:
        try:
            ckw["token_ids"] = [int(x) for x in args.token_ids.split(",")]
        except ValueError:
            raise InvalidInputError(f"--token-ids must be comma-separated integer token ids (e.g. 17,42), got "
                                    f"{args.token_ids!r}.") from None
    shards = plan(len(prompts), args.batch_size, args.n_shards)
    path = write_plan(args.dir, spec, prompts, shards, ckw, args.task, overwrite=args.overwrite)
    print(f"planned {len(shards)} shard(s) of {len(prompts)} prompts in {path}")
    return 0


def _cmd_run(args) -> int:
    from . import allow_loader, allow_read, dist_rank_world, read_plan, run_shards, shards_for_rank

    allow_loader(*(args.allow_loader or ()))  # the launcher's word, never the folder's
    allow_read(*(args.allow_read or ()))
    job = read_plan(args.dir)
    if job.spec is None:
        raise InvalidInputError("this plan records no model spec (it was made from a model object); rerun it from "
                                "Python, or plan it again with --model / --loader.")
    if args.shard is not None:
        by_index = {s.index: s for s in job.shards}
        missing = [i for i in args.shard if i not in by_index]
        if missing:
            raise InvalidInputError(f"--shard {missing}: the plan has shards 0..{len(job.shards) - 1}.")
        shards = [by_index[i] for i in args.shard]
    else:
        rank, world = dist_rank_world()
        rank = args.rank if args.rank is not None else rank
        world = args.world_size if args.world_size is not None else world
        shards = shards_for_rank(job.shards, rank, world)
    if args.no_progress:
        os.environ["BAYES_LENS_PROGRESS"] = "0"
    done = run_shards(job.spec, job.prompts, shards, args.dir, task=job.task, overwrite=args.overwrite,
                      **job.collect_kwargs)
    for i, what in sorted(done.items()):
        print(f"shard {i}: {what}")
    return 0


def _cmd_merge(args) -> int:
    from . import open_shards

    shards = open_shards(args.dir)  # rows in the order the plan was made for (its checked "order")
    layers = _layers(args.layers) if args.layers else None
    col = shards.reduced(None if layers == "all" else layers)
    out = Path(args.out) if args.out else Path(args.dir) / "merged.safetensors"
    col.save(out, {"settings_sha256": shards.manifests[0]["settings_sha256"],
                   "model_fingerprint": shards.model_fingerprint})
    print(f"merged {len(shards.manifests)} shard(s), {col.n_prompts} prompts -> {out}")
    return 0


def _cmd_status(args) -> int:
    from . import status

    st = status(args.dir)
    print(f"finished: {len(st['finished'])} shard(s) " + " ".join(f"{i}[{a},{b})" for i, a, b in st["finished"]))
    if st["pending"] is not None:
        print(f"pending:  {len(st['pending'])} of {st['n_planned']} " +
              " ".join(f"{i}[{a},{b})" for i, a, b in st["pending"]))
    for i, a, b, why in st["damaged"]:
        print(f"damaged:  {'' if i is None else f'{i}[{a},{b}) '}{why}")
    if st["damaged"]:  # exit 1: files need attention (pending shards alone are a normal state, exit 0)
        print(f"bayes-lens: {len(st['damaged'])} damaged shard(s); `bayes-lens shard run {args.dir}` redoes them "
              "(a manifest that does not read: delete it first)", file=sys.stderr)
        return 1
    return 0


def add_subparsers(sub) -> argparse.ArgumentParser:
    """Register ``shard plan|run|merge|status`` on an argparse sub-parsers object."""
    sh = sub.add_parser("shard", help="sharded runs: plan, run (torchrun / SLURM / any runner), merge, status",
                        description="Sharded runs: plan a job, run its shards (torchrun, srun, a SLURM array, any "
                        "job runner), check and merge them. See the README, 'Large models and sweeps'.")
    ssub = sh.add_subparsers(dest="shard_command", required=True, parser_class=type(sh))

    p = ssub.add_parser("plan", help="write a job (plan.json + prompts.jsonl) into DIR",
                        description="Write a job into DIR: the prompts, the model spec, what to collect and "
                        "the shards (split on batch boundaries).")
    p.add_argument("dir", help="job folder to create")
    p.add_argument("--prompts", required=True, help=".jsonl or text file (one prompt a line) (required)")
    p.add_argument("--model", default="default", help=MODEL_HELP + " (default: default)")
    p.add_argument("--kind", default="auto", choices=["auto", "hooked", "bridge"],
                   help=KIND_HELP + " (default: auto)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP + "; resolved on each worker, and "
                   "cuda becomes cuda:LOCAL_RANK under torchrun (default: auto)")
    p.add_argument("--loader", default=None,
                   help="'package.module:function' building the model, instead of --model (default: none)")
    p.add_argument("--model-kwargs", default=None,
                   help="JSON object of keyword arguments for --loader (default: {})")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass (default: 16)")
    p.add_argument("--n-shards", type=int, default=1, help="shards to split the prompts into (default: 1)")
    p.add_argument("--value-layers", type=_layers, default=(),
                   help="layers whose final-token value vectors to keep: 'all' or e.g. 0,5,-1 (default: none)")
    p.add_argument("--resid-layers", type=_layers, default=(),
                   help="layers whose final-token residual stream to keep: 'all' or e.g. 0,5,-1 (default: none)")
    p.add_argument("--attention", action="store_true", help="keep attention entropies (default: off)")
    p.add_argument("--attention-positions", default="last", choices=["last", "all"],
                   help="query positions whose attention entropy is kept (default: last)")
    p.add_argument("--padding-side", default="right", choices=["left", "right"],
                   help="where a batch pads shorter prompts (default: right)")
    p.add_argument("--token-ids", default=None,
                   help="comma-separated token ids whose next-token log-probabilities to keep (default: none)")
    p.add_argument("--task", default=None, help="a label hashed into the settings (default: none)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing plan in DIR (default: off: refuse)")
    p.set_defaults(func=_cmd_plan)

    p = ssub.add_parser("run", help="run shards of the job in DIR (skips finished ones)",
                        description="Run shards of the job in DIR; finished shards are skipped. Without --shard, "
                        "runs the shards of --rank/--world-size (from torchrun or srun), else every shard.")
    p.add_argument("dir", help="job folder written by `shard plan`")
    p.add_argument("--shard", type=int, action="append", default=None,
                   help="run this shard number; repeatable (default: the shards of this rank)")
    p.add_argument("--rank", type=int, default=None, help="this worker's rank (default: RANK or SLURM_PROCID, else 0)")
    p.add_argument("--world-size", type=int, default=None,
                   help="number of workers (default: WORLD_SIZE or SLURM_NTASKS, else 1)")
    p.add_argument("--overwrite", action="store_true", help="redo shards made by another run (default: off)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: bars on)")
    p.add_argument("--allow-loader", action="append", default=None, metavar="MODULE:FUNCTION",
                   help="let this worker import and call this model loader; repeatable (default: only bayes_lens's "
                   "and TransformerLens's own loaders, and those in BAYES_LENS_ALLOW_LOADERS)")
    p.add_argument("--allow-read", action="append", default=None, metavar="MODULE:CLASS",
                   help="let this worker rebuild this Read subclass from the plan; repeatable (default: bayes_lens's "
                   "own reads, and those in BAYES_LENS_ALLOW_READS)")
    p.set_defaults(func=_cmd_run)

    p = ssub.add_parser("merge", help="check the shards in DIR and write the merged collection",
                        description="Check coverage, settings, model fingerprints and file hashes of the shards in "
                        "DIR and write the merged collection.")
    p.add_argument("dir", help="job folder")
    p.add_argument("--out", default=None, help="output .safetensors (default: DIR/merged.safetensors)")
    p.add_argument("--layers", default=None, help="only these layers' rows: 'all' or e.g. 0,5 (default: all)")
    p.set_defaults(func=_cmd_merge)

    p = ssub.add_parser("status", help="finished and pending shards in DIR",
                        description="List the finished and pending shards of the job in DIR.")
    p.add_argument("dir", help="job folder")
    p.set_defaults(func=_cmd_status)
    return sh


