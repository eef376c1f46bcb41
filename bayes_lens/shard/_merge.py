"""Merge shards into one :class:`~bayes_lens.reduced.ReducedCache`, after checking they make one run.

:func:`open_shards` reads every ``shard-*.json`` manifest in a folder (in any order) and refuses,
with a :class:`~bayes_lens.shard.ShardError` naming what differs, unless

* the shards' ranges cover ``[0, n_prompts)`` exactly once (no gap, no overlap),
* every shard has the same settings hash, model fingerprint, prompt count and stored fields,
* each tensor file's size and SHA-256 match its manifest, and its ``indices`` are its range,
* (with ``prompts=``) the prompts' SHA-256s are those the shards ran, in any order: the rows come back
  in the order of ``prompts``, each matched to its prompt by hash;
* (without) the folder's ``plan.json`` reads, matches its own SHA-256 (its ``"order"`` included) and
  plans the prompts the shards ran: the rows come back in the order the plan was made for. Shards of a
  plan (their manifests say ``"planned"``) are refused when the plan is missing; shards run by hand on
  a list without a plan come back as stored.

Shards from different devices, dtypes or library versions merge with a :class:`MixedShardsWarning`
(float results may then differ in the last bits). :meth:`ShardSet.collection` then fills
preallocated tensors shard by shard, reading each tensor's bytes (located by the safetensors header)
straight into its rows; with ``layers=[L]`` it reads only layer ``L``'s rows, so a layer-at-a-time
reduction (:meth:`ShardSet.iter_layers`) holds at most one layer's rows in memory. With batch-aligned shards the merged
reduced cache equals one process bit for bit; the existing reductions (PCA, bootstraps, nulls) then run
on it unchanged, e.g. ``bl.value_manifold(merged, layer=L)``.
"""

from __future__ import annotations

import json
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..collect import check_prompts, inverse_order
from ..reduced import ReducedCache, layer_of, legacy_row_name, row_name, site_of
from ._errors import ShardCoverageError, ShardIntegrityError, ShardMismatchError
from ._job import read_plan
from ._run import read_manifest
from ._store import SAFETENSORS_DTYPES, prompt_hashes, read_into, read_safetensors_header, sha256_file

__all__ = ["ShardSet", "open_shards", "merge", "status", "MixedShardsWarning"]



class MixedShardsWarning(UserWarning):
    """Shards of one merge ran on different devices, dtypes or library versions."""


def _describe(ms: List[Dict[str, Any]]) -> str:
    return ", ".join(f"{m['_file']} [{m['shard']['start']}, {m['shard']['stop']})" for m in ms)


def _check_same(manifests: List[Dict[str, Any]], key: str, what: str, fix: str) -> None:
    groups: Dict[str, list] = {}
    for m in manifests:
        groups.setdefault(json.dumps(m.get(key), sort_keys=True), []).append(m)
    if len(groups) <= 1:
        return
    parts = []
    ref = manifests[0]
    for value, ms in groups.items():
        parts.append(f"{what} {json.loads(value)!r:.80} in {_describe(ms)}")
    detail = ""
    if key == "settings_sha256":
        other = next(ms[0] for ms in groups.values() if ms[0] is not ref)
        a, b = ref.get("settings") or {}, other.get("settings") or {}
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        detail = " Differing settings: " + "; ".join(
            f"{k}: {a.get(k)!r} in {ref['_file']} vs {b.get(k)!r} in {other['_file']}" for k in keys) + "."
    raise ShardMismatchError(f"the shards do not come from one run: {'; '.join(parts)}.{detail} {fix}")


def in_prompt_order(rc: ReducedCache, order: Sequence[int]) -> ReducedCache:
    """``rc``'s rows, which ran in ``order`` (row j is prompt ``order[j]``), in the prompts' own order."""
    back = inverse_order(order)
    if back is None:
        return rc
    tensors = {k: v[back] for k, v in rc.file_tensors().items()}
    tensors["indices"] = torch.arange(len(order))
    return ReducedCache.from_file_tensors(tensors, rc.attention_positions)


class ShardSet:
    """Checked shards of one run in ``out_dir`` (made by :func:`open_shards`).

    ``order``: row j of the shards is prompt ``order[j]`` of the list the rows are returned for (the
    plan's run order); every read puts the rows back in that list's order. None: as stored.
    """

    def __init__(self, out_dir: Path, manifests: List[Dict[str, Any]], order: Optional[Sequence[int]] = None):
        self.out_dir = out_dir
        self.manifests = manifests
        self._back = None if order is None else inverse_order(order)
        self.n_prompts = int(manifests[0]["n_prompts"])
        self.settings = manifests[0]["settings"]
        self.model_fingerprint = manifests[0]["model_fingerprint"]
        self.attention_positions = manifests[0].get("attention_positions", "last")
        self.tensor_shapes = manifests[0]["tensors"]

    @property
    def layers(self) -> Dict[str, List[int]]:
        """Stored row layers per site: ``{"v": [...], "resid_post": [...]}``."""
        out = {"v": [], "resid_post": []}
        for name in self.tensor_shapes:
            if site_of(name) in out:
                out[site_of(name)].append(layer_of(name))
        return {k: sorted(v) for k, v in out.items()}

    def _read(self, names: Sequence[str]) -> Dict[str, Tensor]:
        """The merged tensors ``names``: preallocated, then each shard's bytes read straight into its rows.

        The safetensors header gives each tensor's dtype, shape and byte range; the bytes are read with
        ``readinto`` into the slice of the output they belong to, so reading one layer holds that layer's
        rows and nothing else (no per-shard copy, no memory map).
        """
        out: Dict[str, Tensor] = {}
        for m in self.manifests:
            start, stop = m["shard"]["start"], m["shard"]["stop"]
            path = self.out_dir / m["tensors_file"]
            fix = f"delete {m['_file']} and rerun that shard."
            try:
                with open(path, "rb") as fh:
                    header, data_start = read_safetensors_header(fh)
                    for name in names:
                        entry = header.get(name)
                        if entry is None:
                            raise ShardIntegrityError(f"{str(path)!r} lacks tensor {name!r} that its manifest lists; {fix}")
                        dtype, shape = SAFETENSORS_DTYPES.get(entry["dtype"]), list(entry["shape"])
                        if dtype is None or not shape or shape[0] != stop - start:
                            raise ShardIntegrityError(f"{str(path)!r}: {name} is {entry['dtype']} {shape}, not "
                                                      f"{stop - start} rows for range [{start}, {stop}); {fix}")
                        if name not in out:
                            out[name] = torch.empty((self.n_prompts, *shape[1:]), dtype=dtype)
                        elif out[name].dtype != dtype or list(out[name].shape[1:]) != shape[1:]:
                            raise ShardIntegrityError(f"{str(path)!r}: {name} is {entry['dtype']} {shape}, unlike "
                                                      f"the other shards; {fix}")
                        read_into(fh, data_start, entry, out[name][start:stop])
                        if name == "indices" and not torch.equal(out[name][start:stop],
                                                                 torch.arange(start, stop, dtype=dtype)):
                            raise ShardIntegrityError(f"{str(path)!r} holds other prompts than its manifest's range "
                                                      f"[{start}, {stop}): the files were mixed up; {fix}")
            except ShardIntegrityError:
                raise
            except Exception as err:  # noqa: BLE001 - unreadable file
                raise ShardIntegrityError(f"cannot read {str(path)!r} ({err}); {fix}") from err
        if self._back is not None:  # rows back in the prompts' order, one tensor at a time
            for name in list(out):
                out[name] = (torch.arange(self.n_prompts, dtype=out[name].dtype) if name == "indices"
                             else out[name].index_select(0, self._back))
        return out

    def _names(self, layers: Optional[Iterable[int]], sites: Sequence[str]) -> List[str]:
        keep = None if layers is None else {int(x) for x in layers}
        names = []
        for name in self.tensor_shapes:
            if site_of(name) in ("v", "resid_post"):
                site, layer = site_of(name), layer_of(name)
                if site not in sites or (keep is not None and layer not in keep):
                    continue
            names.append(name)
        if keep is not None:
            held = set(self.layers["v"] if "v" in sites else []) | set(
                self.layers["resid_post"] if "resid_post" in sites else [])
            missing = sorted(keep - held)
            if missing:
                raise ShardMismatchError(f"the shards hold rows at layers {self.layers}, not {missing}; run the "
                                         "shards with those layers in value_layers / resid_layers.")
        return names

    def reduced(self, layers: Optional[Iterable[int]] = None,
                sites: Sequence[str] = ("v", "resid_post")) -> ReducedCache:
        """The merged reduced cache; ``layers`` (and ``sites``) restrict which layers' rows are read."""
        return ReducedCache.from_file_tensors(self._read(self._names(layers, sites)), self.attention_positions)

    def layer_rows(self, layer: int, site: str = "v") -> Tensor:
        """The merged ``[n_prompts, dim]`` rows of one layer and site, read on their own."""
        name = next((n for n in self.tensor_shapes if n in (row_name(layer, site), legacy_row_name(layer, site))),
                    row_name(layer, site))  # the folder's spelling: today's key or an earlier release's hook name
        if name not in self.tensor_shapes:
            raise ShardMismatchError(f"the shards hold {site} rows at layers {self.layers[site]}, not {layer}.")
        return self._read([name])[name]

    def iter_layers(self, site: str = "v") -> Iterator[Tuple[int, Tensor]]:
        """``(layer, rows)`` for every stored layer of ``site``, one layer in memory at a time."""
        for layer in self.layers[site]:
            yield layer, self.layer_rows(layer, site)


def _manifests(out: Path) -> List[Dict[str, Any]]:
    if not out.is_dir():
        raise ShardCoverageError(f"no shard folder {str(out)!r}; run the shards first (bayes-lens shard run).")
    ms = []
    for path in sorted(out.glob("shard-*.json")):
        m = read_manifest(path)
        m["_file"] = path.name
        ms.append(m)
    return ms


def _match(ran: List[str], given: List[str], ms: List[Dict[str, Any]]) -> List[int]:
    """``order`` with ``given[order[j]] == ran[j]`` (row j of the shards is prompt ``order[j]`` of the list
    given now; equal prompts are taken in turn), or the ShardMismatchError naming a prompt the shards did
    not run."""
    where: Dict[str, deque] = {}
    for i, h in enumerate(given):
        where.setdefault(h, deque()).append(i)
    order, unmatched = [], []
    for j, h in enumerate(ran):
        q = where.get(h)
        if q:
            order.append(q.popleft())
        else:
            unmatched.append(j)
    if unmatched:
        extra = min(i for q in where.values() for i in q)
        j = unmatched[0]
        m = next(m for m in ms if m["shard"]["start"] <= j < m["shard"]["stop"])
        raise ShardMismatchError(f"prompt {extra} differs from every prompt the shards ran ({len(unmatched)} of the "
                                 f"{len(given)} given differ; {m['_file']} ran one that was not given): changed "
                                 "prompts. Pass the prompt list the shards were run on (in any order: the rows come "
                                 "back in the order given), or rerun the shards on this one.")
    return order


def _plan_order(out: Path, ran: List[str], n: int, *, planned: bool) -> Optional[List[int]]:
    """The plan's ``"order"`` for ``merge(dir)`` without prompts, checked (plan.json's SHA-256, its prompts against
    the shards' own), or None for shards run by hand on a list without a plan (rows as stored)."""
    path = out / "plan.json"
    if not path.is_file():
        if planned:
            raise ShardIntegrityError(
                f"the shards in {str(out)!r} ran the prompts of a plan in its run order, but {str(path)!r} is missing, "
                "so nothing says which prompt each row is. Pass the prompts the plan was made for "
                "(bl.shard.merge(dir, prompts); their rows are matched by hash), or write the plan again with the "
                "same prompts and settings (bayes-lens shard plan / bl.shard.write_plan; finished shards are kept).")
        return None
    job = read_plan(out)  # every ShardIntegrityError of a plan that does not read, checksum included
    if len(job.prompts) != n:
        raise ShardMismatchError(f"{str(path)!r} plans {len(job.prompts)} prompts but the shards ran {n}; the "
                                 "folder mixes two plans: delete one of them.")
    if prompt_hashes(job.prompts) != ran:
        raise ShardMismatchError(f"{str(path)!r} plans other prompts (or another run order of them) than the shards "
                                 "ran; the folder mixes two plans: delete one of them, or pass the prompts to "
                                 "bl.shard.merge(dir, prompts).")
    return job.order


def open_shards(out_dir: Union[str, Path], prompts: Optional[Sequence[str]] = None, *,
                verify_hashes: bool = True) -> ShardSet:
    """Check the finished shards in ``out_dir`` form one complete run (see the module doc)."""
    out = Path(out_dir)
    ms = _manifests(out)
    if not ms:
        raise ShardCoverageError(f"{str(out)!r} holds no finished shard (no shard-*.json manifest); run the shards "
                                 "first (bayes-lens shard run), or check the folder.")
    fix = "Rerun the odd shards with the same settings and model (delete their files first), or merge them apart."
    _check_same(ms, "n_prompts", "prompt count", fix)
    _check_same(ms, "settings_sha256", "settings hash", fix)
    _check_same(ms, "model_fingerprint", "model fingerprint", fix)
    _check_same(ms, "attention_positions", "attention_positions", fix)
    names = [sorted(m["tensors"]) for m in ms]
    if any(n != names[0] for n in names):
        odd = [m for m, n in zip(ms, names) if n != names[0]]
        raise ShardMismatchError(f"{_describe(odd)} store other tensors than {ms[0]['_file']} "
                                 f"({sorted(set(names[0]) ^ set(sorted(odd[0]['tensors'])))} differ). {fix}")
    ms.sort(key=lambda m: (m["shard"]["start"], m["shard"]["stop"]))
    n = int(ms[0]["n_prompts"])
    pos, prev = 0, None
    for m in ms:
        start, stop = m["shard"]["start"], m["shard"]["stop"]
        if start > pos:
            raise ShardCoverageError(f"prompts [{pos}, {start}) of {n} are in no finished shard (missing between "
                                     f"{prev['_file'] if prev else 'the start'} and {m['_file']}); run the missing "
                                     "shard(s) (bayes-lens shard status lists them), then merge again.")
        if start < pos:
            raise ShardCoverageError(f"{m['_file']} [{start}, {stop}) overlaps {prev['_file']} "
                                     f"[{prev['shard']['start']}, {prev['shard']['stop']}) on prompts [{start}, "
                                     f"{min(pos, stop)}); the folder mixes two plans: delete one of them.")
        pos, prev = stop, m
    if pos != n:
        raise ShardCoverageError(f"prompts [{pos}, {n}) of {n} are in no finished shard (after {prev['_file']}); "
                                 "run the missing shard(s), then merge again.")
    ran = []  # the prompt hashes of the shards' rows, row j of the merged tensors first
    for m in ms:
        hashes = m["prompt_sha256"]
        if not isinstance(hashes, list) or len(hashes) != m["shard"]["stop"] - m["shard"]["start"]:
            raise ShardIntegrityError(f"{m['_file']} lists {len(hashes) if isinstance(hashes, list) else 'no'} prompt "
                                      f"hashes for its range [{m['shard']['start']}, {m['shard']['stop']}): a damaged "
                                      "manifest; delete it and rerun that shard.")
        ran.extend(hashes)
    if prompts is not None:  # rows come back in the order of ``prompts``, each matched to its prompt by hash
        prompts = check_prompts(prompts)
        if len(prompts) != n:
            raise ShardMismatchError(f"the shards were run on {n} prompts, but {len(prompts)} were given now; pass "
                                     "the prompt list the shards were run on.")
        order = _match(ran, prompt_hashes(prompts), ms)
    else:  # rows come back in the order of the list the plan was made for (shards without a plan: as stored)
        order = _plan_order(out, ran, n, planned=any(m.get("planned") for m in ms))
    if verify_hashes:
        for m in ms:
            path = out / m["tensors_file"]
            if not path.is_file():
                raise ShardIntegrityError(f"{m['_file']} names {m['tensors_file']!r}, which is missing; delete "
                                          f"{m['_file']} and rerun that shard.")
            if path.stat().st_size != m["tensors_bytes"] or sha256_file(path) != m["tensors_sha256"]:
                raise ShardIntegrityError(f"{m['tensors_file']!r} does not match the SHA-256 in {m['_file']} (changed, "
                                          f"swapped or truncated after it was written); delete both and rerun that "
                                          "shard.")
    for key, what in (("device", "devices"), ("dtype", "dtypes"), ("versions", "library versions")):
        seen = {json.dumps(m.get(key), sort_keys=True) for m in ms}
        if len(seen) > 1:
            warnings.warn(f"the shards ran on different {what}: {sorted(seen)}; results may differ in the last bits "
                          "from one process.", MixedShardsWarning, stacklevel=2)
    return ShardSet(out, ms, order)


def merge(out_dir: Union[str, Path], prompts: Optional[Sequence[str]] = None, *,
          layers: Optional[Iterable[int]] = None, sites: Sequence[str] = ("v", "resid_post"),
          verify_hashes: bool = True) -> ReducedCache:
    """Check the shards in ``out_dir`` (:func:`open_shards`) and return the merged reduced cache.

    ``layers=[L, ...]`` reads only those layers' rows (the per-prompt fields are always read).

    Example
    -------
    >>> rc = bl.shard.merge("shards/", prompts)                  # doctest: +SKIP
    >>> bl.value_manifold(rc, layer=12)                           # doctest: +SKIP
    """
    return open_shards(out_dir, prompts, verify_hashes=verify_hashes).reduced(layers, sites)


def status(out_dir: Union[str, Path]) -> Dict[str, Any]:
    """Finished shards in ``out_dir`` and, when a plan is there, the planned shards not finished yet.

    A shard counts as finished when its manifest reads and its tensor file is there with the size the
    manifest records (the SHA-256 is left to :func:`merge`, so a status stays quick); one whose files
    are missing, truncated or unreadable is listed under ``"damaged"`` with the reason (and is pending:
    ``bayes-lens shard run`` redoes it). A folder that does not exist, or a file, is a
    :class:`ShardCoverageError` / :class:`ShardIntegrityError`, not an empty status.
    """
    from ._job import read_plan_shards

    out = Path(out_dir)
    if not out.exists():
        raise ShardCoverageError(f"no shard folder {str(out)!r}; plan a job there first (bayes-lens shard plan), or "
                                 "check the path.")
    if not out.is_dir():
        raise ShardIntegrityError(f"{str(out)!r} is a file, not a shard folder; pass the job folder (the one holding "
                                  "plan.json and shard-*.json).")
    done, damaged, n_prompts = {}, [], None
    for path in sorted(out.glob("shard-*.json")):
        try:
            m = read_manifest(path)
        except ShardIntegrityError as err:
            damaged.append((None, None, None, f"{path.name}: {err}"))
            continue
        i, a, b = m["shard"]["index"], m["shard"]["start"], m["shard"]["stop"]
        t = out / str(m["tensors_file"])
        if not t.is_file():
            damaged.append((i, a, b, f"{m['tensors_file']} is missing"))
        elif t.stat().st_size != m["tensors_bytes"]:
            damaged.append((i, a, b, f"{m['tensors_file']} has {t.stat().st_size} bytes, its manifest says "
                                     f"{m['tensors_bytes']}"))
        else:
            done[i] = (a, b)
            n_prompts = m["n_prompts"]
    planned = read_plan_shards(out)
    pending = [(s.index, s.start, s.stop) for s in planned if s.index not in done] if planned is not None else None
    return {"finished": sorted((i, a, b) for i, (a, b) in done.items()), "pending": pending,
            "damaged": damaged, "n_planned": None if planned is None else len(planned), "n_prompts": n_prompts}
