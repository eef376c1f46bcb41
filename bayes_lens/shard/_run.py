"""Run shards: :func:`run_shard` runs the one runner on a shard's prompts and commits its files.

A worker calls :func:`bayes_lens.collect.collect` on ``prompts[shard.start:shard.stop]`` with
``start_index=shard.start`` (so rows carry global prompt indices, and a non-finite value in prompt 37
is reported as prompt 37 whichever worker ran it), then writes ``shard-XXXXX.safetensors`` and, last,
``shard-XXXXX.json`` (see :mod:`bayes_lens.shard._store`). A shard whose manifest is on disk and
matches this run (range, prompt hashes, settings hash, model) is skipped: rerunning a job resumes it.
"Model" means the fingerprint (:func:`~bayes_lens.shard.model_fingerprint`) of the model this run
uses: a run from a :class:`~bayes_lens.shard.ModelSpec` builds the model once even when every shard
is finished, so weights changed behind an unchanged spec are refused, not silently reused.
A manifest that does *not* match is refused rather than overwritten (``overwrite=True`` replaces it).

The settings hash covers the collect arguments that change the numbers (layers, attention,
positions, token ids, batch size, padding side, ``tail_positions`` - recorded only when > 0, so shard
folders made before it existed keep their hash) plus an optional ``task`` label; ``progress`` and
``desc`` do not count. Layers are compared as given (``"all"`` and ``[0, 1]`` are different settings).
``fwd_hooks`` (patches) cannot be hashed, so they need a ``task`` label that names them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import platform
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import torch

from .._files import make_dir
from .._progress import progress as progress_bar
from ..collect import check_prompts, collect, use_runner
from ..reduced import FORMAT
from .._validate import check_count
from ..errors import InvalidInputError
from ._errors import ShardCoverageError, ShardIntegrityError, ShardMismatchError
from ._plan import Shard
from ._spec import ModelSpec, model_device_dtype, model_fingerprint
from ._store import (
    MANIFEST_FORMAT,
    prompt_hashes,
    prompts_digest,
    sha256_file,
    write_json_atomic,
    write_tensors_atomic,
)

__all__ = ["collect_settings", "settings_hash", "run_shard", "run_shards", "commit_shard", "read_manifest", "versions",
           "manifest_path", "tensors_path"]

_SETTINGS = {"value_layers": (), "resid_layers": (), "attention": False, "attention_positions": "last",
             "token_ids": None, "batch_size": 16, "padding_side": "right", "tail_positions": 0}
_UNHASHED = ("progress", "desc", "fwd_hooks", "interventions")
_MANIFEST_KEYS = ("shard", "n_prompts", "prompt_sha256", "settings", "settings_sha256", "model_fingerprint",
                  "tensors_file", "tensors_bytes", "tensors_sha256", "tensors")


def _layers(value, name: str):
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    try:
        return [int(x) for x in value]
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be 'all', an int or a list of ints, got {value!r}.") from None


def collect_settings(collect_kwargs: Dict[str, Any], task: Optional[str] = None) -> Dict[str, Any]:
    """The JSON form of the collect arguments that change the numbers (what the settings hash covers)."""
    unknown = set(collect_kwargs) - set(_SETTINGS) - set(_UNHASHED) - {"reads"}
    if "start_index" in collect_kwargs:
        raise InvalidInputError("do not pass start_index to a sharded run: each shard sets it to its start.")
    if unknown:
        raise InvalidInputError(f"unknown collect argument(s) {sorted(unknown)}; a sharded run accepts "
                                f"{sorted(_SETTINGS) + list(_UNHASHED) + ['reads']}.")
    if collect_kwargs.get("interventions") and not task:
        raise InvalidInputError("interventions are named in the shard settings by their digests: pass task="
                                "'interventions <digest>' (bl.shard.sharded does) so shards of different "
                                "interventions are told apart.")
    if collect_kwargs.get("fwd_hooks") and not task:
        raise InvalidInputError("fwd_hooks cannot be hashed into the shard settings: pass task='<a name for these "
                                "hooks>' so shards made with different hooks are told apart (or put the patch "
                                "in the model loader of the ModelSpec).")
    s = dict(_SETTINGS)
    s.update({k: v for k, v in collect_kwargs.items() if k in _SETTINGS})
    tok = s["token_ids"]
    if tok is not None:
        tok = [int(x) for x in (tok.flatten().tolist() if isinstance(tok, torch.Tensor) else tok)]
    out = {"task": task, "value_layers": _layers(s["value_layers"], "value_layers"),
           "resid_layers": _layers(s["resid_layers"], "resid_layers"), "attention": bool(s["attention"]),
           "attention_positions": str(s["attention_positions"]), "token_ids": tok,
           "batch_size": int(s["batch_size"]), "padding_side": str(s["padding_side"])}
    tail = s["tail_positions"]
    tail = check_count(tail, "tail_positions")
    if tail:
        out["tail_positions"] = int(tail)
    reads = collect_kwargs.get("reads")
    if reads:  # the reads beyond the keywords, as JSON (absent when none: older settings hashes stay valid)
        specs = [r if isinstance(r, dict) else r.spec() for r in reads]
        out["reads"] = sorted(specs, key=lambda d: json.dumps(d, sort_keys=True))
    return out


def settings_hash(settings: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def versions() -> Dict[str, str]:
    """bayes_lens, transformer-lens, torch and safetensors versions of this process."""
    from .. import __version__

    def ver(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    return {"bayes_lens": __version__, "transformer_lens": ver("transformer-lens"), "torch": torch.__version__,
            "safetensors": ver("safetensors"), "python": platform.python_version()}


def manifest_path(out_dir: Union[str, Path], shard: Shard) -> Path:
    return Path(out_dir) / f"{shard.name}.json"


def tensors_path(out_dir: Union[str, Path], shard: Shard) -> Path:
    return Path(out_dir) / f"{shard.name}.safetensors"


def read_manifest(path: Union[str, Path]) -> Dict[str, Any]:
    """A shard manifest, or ShardIntegrityError for a file that is not one."""
    path = Path(path)
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ShardIntegrityError(f"cannot read shard manifest {str(path)!r} ({err}); delete it and rerun that "
                                  "shard.") from err
    if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT:
        raise ShardIntegrityError(f"{str(path)!r} is not a bayes_lens shard manifest (format "
                                  f"{m.get('format') if isinstance(m, dict) else None!r}, expected {MANIFEST_FORMAT!r}).")
    missing = [k for k in _MANIFEST_KEYS if k not in m]
    shard = m.get("shard")
    if missing or not isinstance(shard, dict) or not all(isinstance(shard.get(k), int) for k in ("index", "start",
                                                                                                 "stop")):
        raise ShardIntegrityError(f"shard manifest {str(path)!r} is incomplete (missing {missing or ['shard range']}); "
                                  "delete it and rerun that shard.")
    return m


class _Model:
    """The model of a run, built from a spec only when a shard actually needs running."""

    def __init__(self, model_or_spec):
        if isinstance(model_or_spec, dict):
            model_or_spec = ModelSpec.from_dict(model_or_spec)
        self.spec = model_or_spec if isinstance(model_or_spec, ModelSpec) else None
        self._model = None if self.spec is not None else model_or_spec
        self._fp = None

    def get(self):
        if self._model is None:
            self._model = self.spec.load()
        return self._model

    def fingerprint(self) -> str:
        if self._fp is None:
            self._fp = model_fingerprint(self.get())
        return self._fp

    def difference(self, manifest: Dict[str, Any]) -> Optional[str]:
        """Why a shard was not made by this model, or None: for a spec, the same spec *and* the same
        fingerprint of the model it loads now (the model is built once per run for that: the same
        path or loader can return other weights, e.g. a retrained checkpoint); for a model object,
        the same fingerprint."""
        if self.spec is not None and manifest.get("model_spec") != self.spec.to_dict():
            return f"another model spec ({manifest.get('model_spec')!r}, now {self.spec.to_dict()!r})"
        if manifest.get("model_fingerprint") != self.fingerprint():
            what = (f"the model {self.spec.loader!r} loads now" if self.spec is not None else "this model")
            return (f"another model: {what} has fingerprint {self.fingerprint()[:12]}..., the shard's model "
                    f"{str(manifest.get('model_fingerprint'))[:12]}... (other weights behind the same spec?)")
        return None


def _differences(m: Dict[str, Any], shard: Shard, n_prompts: int, hashes, settings, model: _Model) -> list:
    diff = []
    if (m.get("shard") or {}).get("start") != shard.start or m["shard"].get("stop") != shard.stop:
        diff.append(f"range [{m['shard'].get('start')}, {m['shard'].get('stop')}) instead of "
                    f"[{shard.start}, {shard.stop})")
    if m.get("n_prompts") != n_prompts:
        diff.append(f"{m.get('n_prompts')} prompts in all instead of {n_prompts}")
    elif m.get("prompt_sha256") != hashes:
        diff.append("different prompts")
    if m.get("settings_sha256") != settings_hash(settings):
        old = m.get("settings") or {}
        keys = [k for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
        diff.append("settings " + ", ".join(f"{k}={old.get(k)!r} (now {settings.get(k)!r})" for k in keys))
    other = model.difference(m)
    if other:
        diff.append(other)
    return diff


def _finished(out_dir: Path, shard: Shard, m: Dict[str, Any]) -> bool:
    t = out_dir / str(m.get("tensors_file", ""))
    return t.is_file() and t.stat().st_size == m.get("tensors_bytes") and sha256_file(t) == m.get("tensors_sha256")


def run_shard(model_or_spec, prompts: Sequence[str], shard: Shard, out_dir: Union[str, Path], *,
              task: Optional[str] = None, overwrite: bool = False, **collect_kwargs) -> str:
    """Run one shard of ``prompts`` (the *whole* prompt list; the shard picks its range) and commit its
    files in ``out_dir``. Returns ``"done"`` or ``"skipped"`` (already finished by a matching run)."""
    return run_shards(model_or_spec, prompts, [shard], out_dir, task=task, overwrite=overwrite,
                      **collect_kwargs)[shard.index]


def run_shards(model_or_spec, prompts: Sequence[str], shards: Sequence[Shard], out_dir: Union[str, Path], *,
               task: Optional[str] = None, overwrite: bool = False, **collect_kwargs) -> Dict[int, str]:
    """Run ``shards`` one after another in this process (the model is built once, and only if a shard
    needs running); ``{shard index: "done" | "skipped"}``."""
    prompts = check_prompts(prompts)
    settings = collect_settings(collect_kwargs, task)
    out = make_dir(out_dir, "shard folder")
    model = model_or_spec if isinstance(model_or_spec, _Model) else _Model(model_or_spec)
    hashes_all = prompt_hashes(prompts)
    planned = _planned(out, prompts)
    status = {}
    for shard in progress_bar(list(shards), desc=f"shards -> {out.name}", enabled=collect_kwargs.get("progress"),
                              unit="shard"):
        if shard.stop > len(prompts):
            raise ShardCoverageError(f"{shard.name} covers prompts [{shard.start}, {shard.stop}) but there are only "
                                     f"{len(prompts)} prompts; plan the shards for this prompt list.")
        hashes = hashes_all[shard.start:shard.stop]
        mpath = manifest_path(out, shard)
        if mpath.exists() and not overwrite:
            m = read_manifest(mpath)
            diff = _differences(m, shard, len(prompts), hashes, settings, model)
            if diff:
                raise ShardMismatchError(f"{str(mpath)!r} was made by another run ({'; '.join(diff)}); use another "
                                         "out_dir, or overwrite=True (CLI: --overwrite) to replace it.")
            if _finished(out, shard, m):
                status[shard.index] = "skipped"
                continue
        status[shard.index] = _run_one(model, prompts, shard, out, hashes, settings, collect_kwargs, planned)
    return status


def _planned(out: Path, prompts: Sequence[str]) -> bool:
    """Whether ``prompts`` are the run-order list of the plan in ``out`` (its ``prompts_sha256``), whose rows
    only that plan's order puts back; a plan.json that does not read counts (merging its shards then needs a
    readable plan, or the prompts)."""
    path = out / "plan.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text(encoding="utf-8"))["prompts_sha256"] == prompts_digest(prompts)
    except (OSError, ValueError, KeyError, TypeError):
        return True


def _worker() -> Dict[str, Any]:
    """Which process wrote a shard: torch.distributed rank (or RANK / SLURM_PROCID), world size, pid."""
    import os

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
        world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
    return {"rank": rank, "world_size": world, "pid": os.getpid()}


def _run_one(model: _Model, prompts, shard: Shard, out: Path, hashes, settings, collect_kwargs,
             planned: bool = False) -> str:
    mpath = manifest_path(out, shard)
    if mpath.exists():  # unfinished or replaced: the old commit mark goes first
        mpath.unlink()
    m = model.get()
    kw = dict(collect_kwargs)
    kw.setdefault("desc", f"{shard.name} [{shard.start}, {shard.stop})")
    t0 = time.perf_counter()
    with use_runner(None):  # a shard runs here, whatever sharded() context its caller is in
        col = collect(m, prompts[shard.start:shard.stop], start_index=shard.start, **kw)
    seconds = time.perf_counter() - t0
    device, dtype = model_device_dtype(m)
    commit_shard(out, shard, col, n_prompts=len(prompts), prompt_sha256=hashes, settings=settings,
                 model_spec=None if model.spec is None else model.spec.to_dict(),
                 model_fingerprint=model.fingerprint(), device=device, dtype=dtype, seconds=seconds, planned=planned)
    return "done"


def commit_shard(out_dir: Union[str, Path], shard: Shard, col, *, n_prompts: int, prompt_sha256: Sequence[str],
                 settings: Dict[str, Any], model_fingerprint: str, model_spec: Optional[Dict[str, Any]] = None,
                 device: str = "cpu", dtype: str = "float32", seconds: float = 0.0, planned: bool = False) -> Path:
    """Write ``col`` (the rows of ``shard``) as ``shard-XXXXX.safetensors``, then its manifest (the commit mark).

    ``planned``: the prompts are the run-order list of the folder's plan (``prompts.jsonl``), so the rows
    are not in the order of the prompts the plan was made for and :func:`~bayes_lens.shard.merge` needs
    that plan's ``"order"`` (or the prompts) to return them; it refuses the folder without them.

    :func:`run_shard` calls this after running the model; it is public for engines that compute rows
    another way (and for tests and benchmarks that write synthetic shards).
    """
    out = make_dir(out_dir, "shard folder")
    tensors = col.file_tensors()
    tpath = tensors_path(out, shard)
    write_tensors_atomic(tpath, tensors, {"attention_positions": col.attention_positions, "format": FORMAT})
    manifest = {
        "format": MANIFEST_FORMAT,
        "shard": {"index": shard.index, "start": shard.start, "stop": shard.stop},
        "n_prompts": int(n_prompts),
        "prompt_sha256": list(prompt_sha256),
        "settings": settings,
        "settings_sha256": settings_hash(settings),
        "model_spec": model_spec,
        "model_fingerprint": model_fingerprint,
        "versions": versions(),
        "device": device,
        "dtype": dtype,
        "host": socket.gethostname(),
        "worker": _worker(),
        "attention_positions": col.attention_positions,
        "planned": bool(planned),
        "tensors_file": tpath.name,
        "tensors_bytes": tpath.stat().st_size,
        "tensors_sha256": sha256_file(tpath),
        "tensors": {k: list(v.shape) for k, v in tensors.items()},
        "seconds": round(float(seconds), 3),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    mpath = manifest_path(out, shard)
    write_json_atomic(mpath, manifest)
    return mpath
