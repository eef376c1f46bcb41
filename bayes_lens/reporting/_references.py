"""Published reference numbers and caveats shown next to our measurements (from docs/METHODS.md).

Each entry of :data:`REFERENCES` is keyed by a report metric key and lists what Paper A (Geometric
Scaling of Bayesian Inference in LLMs, arXiv 2512.23752) or Paper B (LLMs are Bayesian, In
Expectation, Not in Realization, arXiv 2507.11768) report for the same quantity, with the section
the number comes from. :data:`CAVEATS` are the METHODS.md decisions a reader must know to compare
our numbers with the papers'. :data:`PAPERS` names the papers (title, arXiv id, link) for the
report, the README and the notebooks. The method definitions are ``docs/METHODS.md``, shipped in the
wheel as ``bayes_lens/data/METHODS.md`` (:func:`methods_path`) and embedded in every report.
Data only: no model runs here.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["REFERENCES", "CAVEATS", "SECTION_CAVEATS", "caveats_for", "PAPERS", "METHODS_URL", "methods_path", "methods_text",
           "reference_number"]

# The papers every "Paper A §x" / "Paper B" in this package refers to (docs/METHODS.md, header).
PAPERS: Dict[str, dict] = {
    "Paper A": {"title": "Geometric Scaling of Bayesian Inference in LLMs", "arxiv": "2512.23752",
                "url": "https://arxiv.org/abs/2512.23752",
                "note": "third part of the 'Bayesian attention trilogy'"},
    "Paper A Part I": {"title": "The Bayesian Geometry of Transformer Attention", "arxiv": "2512.22471",
                       "url": "https://arxiv.org/abs/2512.22471", "note": "wind tunnels"},
    "Paper B": {"title": "LLMs are Bayesian, In Expectation, Not in Realization", "arxiv": "2507.11768",
                "url": "https://arxiv.org/abs/2507.11768", "note": "martingale gap, CoT length"},
    "Falck et al. 2024": {"title": "Is In-Context Learning in Large Language Models Bayesian? A Martingale "
                                   "Perspective", "arxiv": "2406.00793", "url": "https://arxiv.org/abs/2406.00793",
                          "note": "ICML 2024; martingale checks"},
}

# where the method definitions are read online (the same file ships in the wheel)
METHODS_URL = "docs/METHODS.md in the bayes_lens source (also inside the package: bayes_lens/data/METHODS.md)"


def methods_path():
    """The installed copy of docs/METHODS.md (a ``importlib.resources`` Traversable)."""
    return resources.files("bayes_lens").joinpath("data", "METHODS.md")


def methods_text() -> str:
    """The text of the shipped METHODS.md."""
    return methods_path().read_text(encoding="utf-8")


def _r(model: str, value: str, source: str) -> dict:
    return {"model": model, "value": value, "source": source}


A42 = "Paper A §4.2"
REFERENCES: Dict[str, List[dict]] = {
    "geometry.mixed.pc1": [
        _r("Pythia-410M", "79.6%", A42), _r("Phi-2", "46.4%", A42), _r("Llama-3.2-1B", "36.6%", A42),
    ],
    "geometry.mixed.pc12": [
        _r("Pythia-410M", "99.7%", A42), _r("Phi-2", "60.6%", A42), _r("Llama-3.2-1B", "51.4%", A42),
        _r("Pythia-12B", "~19%", A42), _r("Mistral-7B", "15-20%", A42),
        _r("wind tunnels", "84-95%", "Paper A Part I"),
    ],
    "geometry.math.pc1": [
        _r("Pythia-410M", "58.0%", A42), _r("Phi-2", "52.2%", A42), _r("Llama-3.2-1B", "52.5%", A42),
    ],
    "geometry.math.pc12": [
        _r("Pythia-410M", "99.9%", A42), _r("Phi-2", "63.5%", A42), _r("Llama-3.2-1B", "73.6%", A42),
        _r("Pythia-12B", "~90%", A42), _r("Mistral-7B", "~80%", A42),
    ],
    "geometry.key_orthogonality": [
        _r("Pythia-410M (early layers)", "0.11-0.13", A42), _r("Phi-2", "0.034-0.051", A42),
        _r("Llama-3.2-1B", "0.15-0.18", A42), _r("Mistral-7B", "0.05-0.06", A42),
        _r("pass threshold", "< 0.20 in >= 50% of layers", A42),
        _r("wind tunnels", "0.09-0.12", "Paper A Part I"),
    ],
    "geometry.focusing_reduction": [
        _r("Pythia-410M", "82%", "Paper A §4.5"), _r("Phi-2", "86%", "Paper A §4.5"),
        _r("Llama-3.2-1B", "31%", "Paper A §4.5"), _r("Mistral-7B", "20-30% (non-monotone)", "Paper A §4.5"),
        _r("pass threshold", "> 30%", A42), _r("wind tunnels", "85-90%", "Paper A Part I"),
    ],
    "geometry.mixed.alignment_spearman": [
        _r("Pythia-410M", "-0.32", "Paper A §5.1"), _r("Phi-2", "+0.34", "Paper A §5.1"),
        _r("Llama-3.2-1B", "+0.59", "Paper A §5.1"),
    ],
    "geometry.math.alignment_spearman": [
        _r("Pythia-410M", "-0.14", "Paper A §5.1"), _r("Phi-2", "+0.16", "Paper A §5.1"),
        _r("Llama-3.2-1B", "-0.51", "Paper A §5.1"),
    ],
    "sula.mae_bits": [
        _r("Pythia-410M", "0.44 bits", "Paper A §5.2"), _r("Llama-3.2-1B", "0.36 bits", "Paper A §5.2"),
        _r("Phi-2", "0.31 bits", "Paper A §5.2"),
    ],
    "sula.rho_pc1_bayes": [_r("Pythia-410M, Phi-2, Llama-3.2-1B", "|rho| 0.65-0.80", "Paper A §5.2")],
    "sula.rho_k_pc1": [
        _r("Pythia-410M", "0.86", "Paper A §5.2"), _r("Phi-2", "0.60", "Paper A §5.2"),
        _r("Llama-3.2-1B", "0.32", "Paper A §5.2"),
    ],
    "ablation.corr_clean": [_r("Pythia-410M", "0.27-0.32", "Paper A §6.2")],
    "ablation.corr_removed": [
        _r("Pythia-410M, single layer", "~0", "Paper A §6.2"),
        _r("Pythia-410M, layers 8-23", "0.07", "Paper A §6.2"),
    ],
    "ablation.delta_mae_bits": [_r("Pythia-410M, layers 8-23", "< 1% change", "Paper A §6.2")],
    "ablation.delta_corr_random": [_r("Pythia-410M", "~0.01", "Paper A §6.2")],
    "martingale.A": [_r("GPT-3 text-davinci-002", "0.182 ± 0.021", "Paper B eq. 27")],
    "martingale.B": [_r("GPT-3 text-davinci-002", "-0.0043 ± 0.0018", "Paper B eq. 27")],
    "martingale.adj_r2": [
        _r("GPT-3 text-davinci-002, log n / n", "0.759", "Paper B"),
        _r("GPT-3 text-davinci-002, 1/n", "< 0.3", "Paper B"),
    ],
    "martingale.permutation_slope": [_r("GPT-3 text-davinci-002", "-0.48 [-0.52, -0.44]; theory -0.5",
                                        "Paper B")],
}

# (the report sections a caveat concerns, or None for every report; its text). A report lists only the
# caveats of the sections it ran: a geometry-only report has no SULA, ablation or martingale caveats.
SECTION_CAVEATS: List[Tuple[Optional[Tuple[str, ...]], str]] = [
    (("geometry",), "Paper A's ≈5% 'random baseline' for PC1 is wrong at these sample sizes; the baseline shown here is "
     "simulated i.i.d. Gaussian data of the same n × d (METHODS.md §1)."),
    (("geometry", "sula", "ablation"), "Values are read per key/value head (hook_v), never on the repeated copies "
     "grouped-query attention makes; Paper A's public script used final-layer residual states on 13 prompts "
     "(METHODS.md §0, §1)."),
    (("geometry",), "Key orthogonality: the dimension-matched Gaussian baseline is √(2/(π·d_model)); Paper A compares "
     "against √(2/(π·d_head)), shown as 'paper convention'. Trained values of 0.03-0.18 are above the "
     "dimension-matched baseline. The paper's 0.35-0.45 at step 0 cannot come from i.i.d. initialization "
     "and is not used (METHODS.md §2)."),
    (("geometry", "sula"), "The sign of a principal component is arbitrary: compare |rho| with the papers' "
     "correlations (METHODS.md §4)."),
    (("geometry",), "Paper A's prompts are not public and its text contradicts its tables in places; our prompt pools "
     "are our own (written text, programmatic maths, code), so domain numbers are comparable in kind, not "
     "digit for digit (METHODS.md §5)."),
    (("sula",), "SULA evidence-removed control replaces example labels with a placeholder; the paper masks the "
     "carrier words instead. Under the stated generative model carriers carry no evidence (METHODS.md §6)."),
    (("ablation",), "Entropy-axis ablation: λ = 1 is full removal (the public code reverses λ), the random control is "
     "orthogonalized against the axis, and negative layer indices are resolved explicitly (METHODS.md §7, §12)."),
    (("martingale",), "Martingale gap: Paper B's numbers are for GPT-3 text-davinci-002 with 100 sequences for every "
     "even n up to 198; this report uses fewer sequences and lengths (see settings), so its CIs are wider."),
    (("martingale",), "Chain-of-thought length (Paper B Thm 4.5) uses the natural log by default: the paper writes log₂ "
     "but its worked examples only come out with ln (METHODS.md §10)."),
    (None, "Entropies are in bits throughout. The default model is SmolLM2-135M-Instruct quantized to Q4_1 "
     "(GGUF); quantization may shift small effects."),
    (None, "Intervals are 95% percentile bootstrap intervals over prompts (or sequences), seeded; quick reports "
     "use few prompts and give wide intervals."),
]

CAVEATS: List[str] = [text for _, text in SECTION_CAVEATS]


def caveats_for(sections: Sequence[str]) -> List[str]:
    """The caveats a report of ``sections`` (their names) must list: the general ones and those of its sections."""
    names = set(sections)
    return [text for about, text in SECTION_CAVEATS if about is None or names & set(about)]


_N = r"[-−+]?\d+(?:\.\d+)?"


def _f(s: str) -> float:
    return float(s.replace("−", "-"))


def reference_number(ref: dict, units: str) -> Optional[dict]:
    """Where the papers' number ``ref`` (an entry of :data:`REFERENCES`) goes on an axis of ``units``.

    ``{"kind": "value", "value": v, "low": lo, "high": hi}`` for a reported value (a range "0.11-0.13"
    or "15-20%" is drawn at its middle with its ends, "0.182 ± 0.021" and "-0.48 [-0.52, -0.44]" with
    their intervals, "~19%" at 0.19), ``{"kind": "threshold", ...}`` for a "pass threshold" entry
    ("> 30%", "< 0.20 in >= 50% of layers"), and None for what is not a point on the same axis: a bound
    ("< 1% change", "< 0.3"), a |ρ| (the axis is signed) or a percentage on an axis that is not a fraction.
    Percentages become fractions. Only the figure uses this; the tables show the papers' own text.
    """
    text = str(ref.get("value", "")).split(";")[0].strip()
    threshold = str(ref.get("model", "")).strip().lower() == "pass threshold"
    if threshold:
        patterns = [(r"^[<>]=?\s*(" + _N + r")\s*(%?)", "t")]
    elif text.startswith(("<", ">", "|")):
        return None
    else:
        patterns = [(r"^~?\s*(" + _N + r")\s*(%?)\s*±\s*(\d+(?:\.\d+)?)\s*(%?)", "pm"),
                    (r"^~?\s*(" + _N + r")\s*(%?)\s*\[\s*(" + _N + r")\s*%?\s*,\s*(" + _N + r")\s*(%?)\s*\]", "ci"),
                    (r"^~?\s*(" + _N + r")\s*(%?)\s*[-–]\s*(\d+(?:\.\d+)?)\s*(%?)", "range"),
                    (r"^~?\s*(" + _N + r")\s*(%?)", "one")]
    for pattern, how in patterns:
        m = re.match(pattern, text)
        if not m:
            continue
        pct = "%" in m.group(0)
        if pct and units != "fraction":
            return None
        scale = 0.01 if pct else 1.0
        g = [x for x in m.groups() if x and x != "%"]
        nums = [_f(x) * scale for x in g]
        if how == "pm":
            v, d = nums
            lo, hi = v - d, v + d
        elif how == "ci":
            v, lo, hi = nums
        elif how == "range":
            lo, hi = nums
            v = (lo + hi) / 2
        else:
            v = lo = hi = nums[0]
        return {"kind": "threshold" if threshold else "value", "value": v, "low": lo, "high": hi}
    return None
