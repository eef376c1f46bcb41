"""One call, everything the library measures: an HTML + JSON report of a model's Bayesian geometry.

``bl.report(model, out)`` runs, in order,

1. **geometry** (Paper A §4.2, §5.1): value manifold (PC1, PC1+PC2 explained variance with bootstrap
   CIs and a simulated Gaussian null), key orthogonality (mean |cos| between W_K columns per KV
   head, against √(2/(π·d_model))), attention focusing (final-row attention entropy per layer, the
   first-to-last reduction) and entropy alignment (Spearman ρ of PC1 with next-token entropy), on
   an entropy-stratified mixed prompt set and on restricted domains (maths, code, philosophy);
2. **sula** (Paper A §4.3, §5.2): calibration of the model's label posterior against the analytic
   Bayes posterior P(y|D) = 1/(1 + ((1−p)/p)^(2m−k)), MAE in bits, with the lexical-remap,
   shuffled-label and evidence-removed controls;
3. **ablation** (Paper A §6.2): the entropy axis (PC1 of final-token values on SULA prompts) removed,
   v ← v − (v·u)u, against a random orthogonal direction: does geometry break while calibration
   survives?
4. **martingale** (Paper B eq. 27; Falck et al. 2024): the martingale gap Δ_n on balanced binary
   sequences and its fit A·log(n)/n + B.

and writes ``out/report.json`` (schema: ``docs/report_schema.md``, JSON Schema
``bayes_lens/reporting/report.schema.json``), ``out/tables/*.csv`` and one self-contained
``out/report.html`` (plotly.js inline; opens with no network). The report is switched in by one
atomic rename of a pointer (``out/.bayes_lens/current``; the three entries are links through it,
see :mod:`bayes_lens.reporting._atomic`), holding the folder's lock: an interrupted or killed run
leaves the complete old or the complete new report, never a mix.

Failure policy: bad input (not a model, an unwritable folder, an unknown section) raises a
BayesLensError before anything runs; an analysis that fails is recorded in its section
(``status: "error"`` with the message) and the other sections still run (``strict=True``
re-raises instead).

Example
-------
>>> import bayes_lens as bl
>>> model = bl.load_model()                                       # doctest: +SKIP
>>> doc = bl.report(model, "report/", quick=True)                 # doctest: +SKIP
>>> doc["sections"]["sula"]["metrics"][0]["value"]                # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

from .._validate import (check_bool, check_int, check_mapping, check_names, check_path, check_seed,
                         describe)
from ..errors import InvalidInputError
from ._core import SCHEMA_VERSION, Metric, SectionOutput, check_sections, run_report
from ._document import ReportDocument, SectionPrinter, summary_table
from ._references import PAPERS, METHODS_URL, methods_path

__all__ = ["report", "prepare_report", "run_model_report", "sizes", "SECTIONS", "SCHEMA_VERSION", "schema",
           "validate", "Metric", "SectionOutput", "check_override", "ReportDocument", "SectionPrinter",
           "summary_table", "PAPERS", "METHODS_URL", "methods_path"]


def sizes(quick: bool) -> Dict[str, Any]:
    """Prompt counts, sequence lengths, seeds per section for a quick or a full report."""
    from ._sections import FULL, QUICK

    return dict(QUICK if quick else FULL)


def _registry():
    from ._sections import SECTIONS as registry

    return registry


class _SectionsView:
    """Read-only view of the section registry (names in run order), for docs and the CLI."""

    def __iter__(self):
        return iter(_registry())

    def __repr__(self):
        return repr(list(_registry()))


SECTIONS = _SectionsView()


@lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON Schema (draft 2020-12) of report.json."""
    text = resources.files(__package__).joinpath("report.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(doc: Union[dict, str, Path]) -> dict:
    """Validate a report document (or the path of a report.json) against :func:`schema`.

    Raises ``jsonschema.ValidationError`` if it does not conform; returns the document. Needs the
    ``jsonschema`` package (extra ``validate``): without it, a :class:`~bayes_lens.errors.MissingExtraError`
    says how to install it.
    """
    from ..errors import require_extra

    require_extra("jsonschema", "validate")
    import jsonschema

    if not isinstance(doc, dict):
        doc = json.loads(Path(doc).read_text(encoding="utf-8"))
    jsonschema.validate(doc, schema(), cls=jsonschema.Draft202012Validator)
    return doc


def report(
    model,
    out: Union[str, Path] = "report",
    *,
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    sections: Optional[Iterable[str]] = None,
    strict: bool = False,
    overrides: Optional[Dict[str, Any]] = None,
) -> ReportDocument:
    """Run the analyses on ``model`` and write ``out/report.json``, ``out/report.html``, ``out/tables/``.

    Parameters
    ----------
    model:
        A HookedTransformer or TransformerBridge, or a name accepted by :func:`bl.load_model`
        (``"default"``, a ``.gguf`` path, a local Hugging Face folder) which is then loaded.
    out:
        Output folder (created if needed; must be writable).
    quick:
        Shrink every size (fewer prompts, shorter sequences): minutes instead of a quarter hour.
    seed:
        Seed of every random draw (prompt selection, bootstraps, random controls).
    progress:
        Show progress bars (also switched off by ``BAYES_LENS_PROGRESS=0``).
    sections:
        Names of the sections to run (default: geometry, sula, ablation, martingale; opt-in: tasks,
        localize). A section that reads another's results brings it in, before it (ablation and localize
        add sula).
    strict:
        Re-raise an analysis failure instead of recording it in the report.
    overrides:
        Replace individual sizes (see :func:`sizes`), e.g. ``{"geometry_n": 40}``.

    Returns
    -------
    ReportDocument
        The report document, as written to ``report.json`` (a ``dict``: ``doc["sections"]``,
        ``doc["summary"]``), with ``.path``, ``.html``, ``.summary()`` and a one-line repr.

    With progress on, prints ``bayes-lens: [i/n] section ...`` lines on stderr as the CLI does. A
    quick report takes a few minutes on SmolLM2-135M on 2 CPU cores, a full one about a quarter hour.
    """
    printer = None
    if progress and os.environ.get("BAYES_LENS_PROGRESS", "1") not in ("0", "false", "False", ""):
        # the sections that will run: those named, with the ones they need (check_sections), for "[i/n]"
        names = [s.name for s in check_sections(check_names(sections, "sections", allow_empty=True)
                                                if sections is not None else None, _registry())]
        printer = SectionPrinter(names)
    return run_model_report(model, out, quick=quick, seed=seed, progress=progress, sections=sections, strict=strict,
                            overrides=overrides, on_section=printer)


def prepare_report(out, *, seed, sections, quick, overrides):
    """Check the cheap inputs (seed, sections, output folder, sizes) before any model work."""
    from ..errors import require_extra
    from ._atomic import check_writable

    require_extra("plotly", "plot")  # the HTML needs plotly: fail before any model work
    check_seed(seed)
    check_bool(quick, "quick")
    # one string is one section name ("geometry"), never a list of its characters
    chosen = check_sections(check_names(sections, "sections", allow_empty=True) if sections is not None else None, _registry())
    check_path(out, "out", kind="dir")
    check_writable(out)
    the_sizes = sizes(quick)
    for key, value in check_mapping(overrides, "overrides").items():
        if key not in the_sizes:
            raise InvalidInputError(f"unknown size {key!r}; known sizes: {sorted(the_sizes)}.")
        the_sizes[key] = check_override(key, value, the_sizes[key])
    return chosen, the_sizes


def check_override(key: str, value: Any, default: Any) -> Any:
    """``value`` for size ``key`` if it has the type of the default size; else InvalidInputError.

    Integers stay integers >= 1, tuples stay lists/tuples of the default's element type, a dict
    override (e.g. ``martingale_permutation``) may set any of the default's keys, and
    ``ablation_layer`` is ``"middle"`` or a layer index.
    """
    name = f"overrides[{key!r}]"
    example = f"(the default is {default!r})"
    if isinstance(default, bool):
        return check_bool(value, name)
    if isinstance(default, int):
        try:
            return check_int(value, name, min=1)
        except InvalidInputError as err:
            raise InvalidInputError(f"{err} {example}") from None
    if isinstance(default, str):  # ablation_layer: "middle" or an integer layer index
        if isinstance(value, str) and value == default:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        raise InvalidInputError(f"{name} must be {default!r} or an integer layer index, got {describe(value)}.")
    if isinstance(default, tuple):
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple, range)):
            raise InvalidInputError(f"{name} must be a list or tuple {example}, got {describe(value)}.")
        value = tuple(value)
        if not value:
            raise InvalidInputError(f"{name} is empty; give at least one value {example}.")
        kinds = {type(v) for v in default}
        for v in value:
            if str in kinds and not isinstance(v, str):
                raise InvalidInputError(f"{name} must hold strings {example}, got {describe(v)}.")
            if int in kinds:
                check_int(v, f"each value of {name}", min=0)
        return tuple(int(v) if int in kinds else v for v in value)
    if isinstance(default, dict):
        value = check_mapping(value, name, allow_none=False)
        unknown = sorted(set(value) - set(default))
        if unknown:
            raise InvalidInputError(f"{name} has unknown keys {unknown}; known: {sorted(default)}.")
        return {**default, **{k: check_override(f"{key}.{k}", v, default[k]) for k, v in value.items()}}
    return value


def run_model_report(model, out, *, quick, seed, progress, sections, strict, overrides, source=None,
                     extra_timings=None, on_section=None) -> ReportDocument:
    """:func:`report` with the CLI's extras: the model's source label, timings, a per-section callback."""
    chosen, the_sizes = prepare_report(out, seed=seed, sections=sections, quick=quick, overrides=overrides)
    extra = dict(extra_timings or {})
    if isinstance(model, (str, Path)):
        from ..models import load_model

        source = str(model)
        t0 = time.perf_counter()
        model = load_model(source)
        extra["model_load"] = time.perf_counter() - t0
    else:
        from ..adapter import model_info

        model_info(model)  # raises InvalidInputError for anything that is not a TransformerLens model
    doc = run_report(model, out, sections=chosen, quick=quick, seed=seed, progress=progress,
                     sizes=the_sizes, strict=strict, source=source, extra_timings=extra,
                     on_section=on_section)
    return ReportDocument(doc, out)

from .._namespace import package_dir, submodule_getattr  # noqa: E402

__dir__ = package_dir(globals())
__getattr__ = submodule_getattr(globals())
