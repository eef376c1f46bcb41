"""The report runner: sections, headline metrics, the JSON document, CSV tables and the HTML page.

A report is a list of *sections* (geometry, SULA, ablation, martingale). Each section is a function
``run(ctx) -> SectionOutput`` that calls the public analyses and returns headline :class:`Metric`
records (value, units, 95% CI, random baseline, the papers' numbers), DataFrames (written as CSV)
and plotly figures. :func:`run_report` runs them in order, times them, and writes everything
through :class:`~bayes_lens.reporting._atomic.Staging` so that an existing report is only ever
replaced by a complete one.

Failure policy (documented in docs/report_schema.md): *bad input fails loudly* - a non-model, an
unwritable output folder, an unknown section name raise a :class:`~bayes_lens.errors.BayesLensError`
before any model run. *An analysis that fails* inside a section (any ``Exception``, including a
BayesLensError raised by that analysis, e.g. "no single-token SULA labels for this tokenizer") is
recorded in that section as ``status: "error"`` with the exception type, message and traceback, the
other sections still run, and the report's top-level ``status`` becomes ``"partial"``; pass
``strict=True`` to re-raise instead. ``KeyboardInterrupt``/``SystemExit`` are never caught: they
abort the run and leave the previous report untouched.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata as _md
import json
import math
import os
import platform
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._results import Estimate, jsonable
from ..errors import InvalidInputError
from ._atomic import Staging, check_writable, write_text
from ._references import REFERENCES, caveats_for
from .._files import sha256_file

__all__ = ["Metric", "SectionOutput", "Context", "Section", "run_report", "SCHEMA_VERSION"]

SCHEMA_VERSION = "1.2.0"  # 1.1: a baseline may carry the 95% range of its null ("low", "high");
#                          1.2: model.n_weights and model.parameters_note (optional)
_DETAILS_MAX_BYTES = 2_000_000
CI_METHOD = "95% percentile bootstrap over prompts (seeded)"


def _num(x) -> Optional[float]:
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class Metric:
    """One headline number of a report: value, units, 95% CI, random baseline and the papers' numbers.

    ``ci`` is ``(low, high)`` or None where no interval exists (e.g. a weight statistic); ``baseline``
    is ``(value, label)`` or None where the quantity has no random null. ``fraction`` units are in
    [0, 1] (shown as %). ``value`` may be an :class:`~bayes_lens.Estimate`: its ``ci`` and
    ``ci_method`` are then used unless given here, and its ``null_interval`` becomes the baseline's
    95% range (``baseline_range``; the report draws it as a band) when the baseline is its ``null``.
    """

    key: str
    label: str
    value: Any
    units: str
    ci: Optional[Tuple[Any, Any]] = None
    baseline: Optional[Tuple[Any, str]] = None
    note: str = ""
    ci_method: str = CI_METHOD
    verdict: Optional[dict] = None  # {"pass": bool, "text": ...} for a threshold the section evaluated
    baseline_range: Optional[Tuple[Any, Any]] = None  # the null's 95% range, where the null is a distribution

    def __post_init__(self):
        if isinstance(self.value, Estimate):
            est = self.value
            if (self.baseline_range is None and self.baseline is not None and est.null_interval is not None
                    and est.null is not None and _num(self.baseline[0]) == _num(est.null)):
                object.__setattr__(self, "baseline_range", tuple(est.null_interval))
            object.__setattr__(self, "value", est.value)
            if self.ci is None:
                object.__setattr__(self, "ci", est.ci)
                if self.ci_method == CI_METHOD:
                    object.__setattr__(self, "ci_method", est.ci_method)

    def to_json(self) -> dict:
        ci = None
        if self.ci is not None:
            lo, hi = _num(self.ci[0]), _num(self.ci[1])
            if lo is not None or hi is not None:
                ci = {"low": lo, "high": hi, "level": 0.95, "method": self.ci_method}
        base = None
        if self.baseline is not None:
            base = {"value": _num(self.baseline[0]), "label": str(self.baseline[1])}
            lo, hi = (_num(x) for x in (self.baseline_range or (None, None)))
            if lo is not None and hi is not None:
                base.update(low=lo, high=hi)
        from ._verdicts import verdict

        doc = {
            "key": self.key,
            "label": self.label,
            "value": _num(self.value),
            "units": self.units,
            "ci": ci,
            "baseline": base,
            "references": REFERENCES.get(self.key, []),
            "note": self.note,
            "verdict": self.verdict,
        }
        doc["verdict"] = verdict(doc)
        return doc


@dataclass
class SectionOutput:
    """What a section hands back: metrics, tables (name -> DataFrame), figures, notes, raw results."""

    metrics: List[Metric] = field(default_factory=list)
    tables: Dict[str, Any] = field(default_factory=dict)
    figures: List[Tuple[str, Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)
    settings: Dict[str, Any] = field(default_factory=dict)

    def figure(self, title: str, make: Callable[[], Any]) -> None:
        """Add ``make()`` as a figure; a plotting failure becomes a note, never a failed section."""
        try:
            fig = make()
        except Exception as err:  # noqa: BLE001 - a broken plot must not hide the numbers
            self.notes.append(f"figure {title!r} could not be drawn: {type(err).__name__}: {err}")
            return
        if fig is not None:
            self.figures.append((title, fig))


@dataclass
class Context:
    """Everything a section needs: the model, sizes for this run, the seed and shared results."""

    model: Any
    quick: bool
    seed: int
    progress: bool
    sizes: Dict[str, Any]
    shared: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    description: str
    run: Callable[[Context], SectionOutput]
    requires: Tuple[str, ...] = ()
    default: bool = True  # run when no sections are named (an opt-in section costs more than it is read)
    after: Tuple[str, ...] = ()  # sections whose results it reads: check_sections adds them, before it


def _version(dist: str) -> Optional[str]:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def environment(model) -> dict:
    import torch

    from .. import __version__
    from ..adapter import model_device

    return {
        "bayes_lens": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformer_lens": _version("transformer-lens"),
        "transformers": _version("transformers"),
        "numpy": np.__version__,
        "scipy": _version("scipy"),
        "pandas": _version("pandas"),
        "plotly": _version("plotly"),
        "device": str(model_device(model)),
    }


def model_identity(model, source: Optional[str]) -> dict:
    from ..adapter import model_info

    info = model_info(model)
    out = {k: v for k, v in dataclasses.asdict(info).items()}
    out["source"] = source
    out["n_parameters"] = int(sum(p.numel() for p in model.parameters()))
    weights, why = _checkpoint_weights(model)
    out["n_weights"] = int(weights)  # the checkpoint's: a tied unembedding once, no all-zero biases
    out["parameters_note"] = why
    return out


def _checkpoint_weights(model) -> Tuple[int, str]:
    """``(the checkpoint's weight count, why it differs from the count as loaded)``:
    :func:`bayes_lens.adapter.parameter_counts` (the CLI's ``info`` prints the same)."""
    from ..adapter import parameter_counts

    _, weights, why = parameter_counts(model)
    return weights, why


def _safe_name(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s).strip("_") or "table"


def _details(details: Dict[str, Any]) -> Tuple[dict, Optional[str]]:
    data = jsonable(details)
    size = len(json.dumps(data))
    if size > _DETAILS_MAX_BYTES:
        return {}, f"raw results ({size / 1e6:.1f} MB as JSON) left out of report.json; see the CSV tables"
    return data, None


def _run_section(section: Section, ctx: Context, strict: bool) -> Tuple[dict, SectionOutput]:
    t0 = time.perf_counter()
    record = {"name": section.name, "title": section.title, "description": section.description,
              "status": "ok", "error": None}
    missing = [r for r in section.requires if r not in ctx.shared]
    if missing:
        record["status"] = "skipped"
        record["error"] = {"type": "Skipped", "message": f"needs the results of {missing}, which failed or did not run",
                           "traceback": ""}
        out = SectionOutput()
    else:
        try:
            out = section.run(ctx)
        except Exception as err:  # noqa: BLE001 - recorded per section (see the module docstring)
            if strict:
                raise
            record["status"] = "error"
            record["error"] = {"type": type(err).__name__, "message": str(err),
                               "traceback": traceback.format_exc(limit=8)}
            out = SectionOutput()
    record["seconds"] = time.perf_counter() - t0
    return record, out


def run_report(
    model,
    out,
    *,
    sections: Sequence[Section],
    quick: bool,
    seed: int,
    progress: bool,
    sizes: Dict[str, Any],
    strict: bool = False,
    source: Optional[str] = None,
    extra_timings: Optional[Dict[str, float]] = None,
    on_section: Optional[Callable[[str, str], None]] = None,
) -> dict:
    """Run ``sections`` on ``model`` and write ``out/report.json``, ``out/report.html``, ``out/tables``.

    Returns the report document (the content of report.json).
    """
    from ._html import render_html

    out = check_writable(out)
    t_start = time.perf_counter()
    created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    ctx = Context(model=model, quick=quick, seed=seed, progress=progress, sizes=dict(sizes))
    records, outputs = [], []
    for section in sections:
        if on_section:
            on_section(section.name, "start")
        record, output = _run_section(section, ctx, strict)
        records.append(record)
        outputs.append(output)
        if on_section:
            on_section(section.name, record["status"])

    doc: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "generator": "bayes_lens.report",
        "created_utc": created,
        "status": "ok" if all(r["status"] == "ok" for r in records) else "partial",
        "model": model_identity(model, source),
        "environment": environment(model),
        "settings": {"quick": bool(quick), "seed": int(seed), "sizes": jsonable(sizes)},
        "timings_s": {},
        "sections": {},
        "summary": [],
        "caveats": caveats_for([s.name for s in sections]),
        "files": {},
    }
    with Staging(out) as staging:
        tables_dir = staging.path / "tables"
        tables_dir.mkdir()
        for record, output in zip(records, outputs):
            tables = []
            for name, df in output.tables.items():
                fname = f"{_safe_name(record['name'])}__{_safe_name(name)}.csv"
                write_text(tables_dir / fname, df.to_csv(index=False))
                tables.append({"name": name, "file": f"tables/{fname}", "columns": [str(c) for c in df.columns],
                               "n_rows": int(len(df))})
            details, note = _details(output.details)
            notes = list(output.notes) + ([note] if note else [])
            metrics = [m.to_json() for m in output.metrics]
            doc["sections"][record["name"]] = {
                **record,
                "settings": jsonable(output.settings),
                "metrics": metrics,
                "tables": tables,
                "figures": [{"title": t, "id": f"fig-{_safe_name(record['name'])}-{i}"}
                            for i, (t, _) in enumerate(output.figures)],
                "notes": notes,
                "details": details,
            }
            for m in metrics:
                doc["summary"].append({"section": record["name"], **{k: m[k] for k in
                                       ("key", "label", "value", "units", "ci", "baseline", "references", "verdict")}})
            doc["timings_s"][record["name"]] = record["seconds"]
        for k, v in (extra_timings or {}).items():
            doc["timings_s"][k] = float(v)
        doc["timings_s"]["total"] = time.perf_counter() - t_start + sum((extra_timings or {}).values())

        html = render_html(doc, [o.figures for o in outputs], [o.tables for o in outputs])
        write_text(staging.path / "report.html", html)
        for f in sorted(tables_dir.iterdir()):
            doc["files"][f"tables/{f.name}"] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
        doc["files"]["report.html"] = {"sha256": sha256_file(staging.path / "report.html"),
                                       "bytes": (staging.path / "report.html").stat().st_size}
        write_text(staging.path / "report.json", json.dumps(doc, indent=1, allow_nan=False))
        staging.commit(["tables", "report.html", "report.json"])
    return doc


def check_sections(names, registry: Dict[str, Section]) -> List[Section]:
    if names is None:
        return [s for s in registry.values() if s.default]
    if isinstance(names, str):
        names = [names]
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise InvalidInputError(f"unknown report section(s) {unknown}; choose from {list(registry)}.")
    if not names:
        raise InvalidInputError(f"no sections selected; choose from {list(registry)}.")
    dup = sorted({n for n in names if list(names).count(n) > 1})
    if dup:
        raise InvalidInputError(f"report sections {dup} are named more than once; name each once.")
    # a section that reads another's results (ablation, localize: the SULA prompts) pulls that one in, before
    # it; otherwise the order asked for (it was skipped as "needs the results of ...", or failed)
    ordered: List[str] = []

    def add(name: str) -> None:
        if name in ordered:
            return
        for before in registry[name].after:
            if before in registry:
                add(before)
        ordered.append(name)

    for n in names:
        add(n)
    return [registry[n] for n in ordered]

