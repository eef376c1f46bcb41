"""The report runner on a tiny model with stand-in sections: JSON schema, CSVs, HTML, failures, interrupts.

The real analyses run in test_report_e2e.py (SmolLM2, one shared quick report); here the sections
are small functions so the runner's own behaviour is checked quickly and exactly.
"""

from __future__ import annotations

import hashlib
import json
import re

import jsonschema
import numpy as np
import pandas as pd
import pytest

import bayes_lens as bl
from bayes_lens.errors import InvalidInputError
from bayes_lens.reporting import Metric, SectionOutput, _sections, validate
from bayes_lens.reporting._core import Section


@pytest.fixture(scope="module")
def tiny_model():
    from bayes_lens.models.tiny import tiny_model as make

    return make("bridge", gqa=True, rotary=True)


def _ok_section(ctx):
    import plotly.graph_objects as go

    rng = np.random.default_rng(ctx.seed)
    x = rng.normal(size=50)
    out = SectionOutput(settings={"n": 50})
    lo, hi = np.quantile([rng.choice(x, 50).mean() for _ in range(200)], [0.025, 0.975])
    out.metrics.append(Metric("geometry.mixed.pc1", "mean of x", float(x.mean()), "bits", (lo, hi),
                              (0.0, "zero"), note="stand-in"))
    out.metrics.append(Metric("geometry.key_orthogonality", "nan value", float("nan"), "cosine"))
    out.tables["draws"] = pd.DataFrame({"i": np.arange(50), "x_bits": x})
    out.figure("histogram", lambda: go.Figure(go.Histogram(x=x)))
    out.figure("broken", lambda: 1 / 0)  # a plotting failure becomes a note
    ctx.shared["x"] = x
    return out


def _fail_section(ctx):
    raise ValueError("analysis exploded on purpose")


def _needs_x(ctx):
    out = SectionOutput()
    out.metrics.append(Metric("ablation.corr_clean", "uses x", float(ctx.shared["x"].std()), "correlation"))
    return out


@pytest.fixture
def fake_sections(monkeypatch):
    reg = {
        "geometry": Section("geometry", "Stand-in geometry", "ok section", _ok_section),
        "sula": Section("sula", "Stand-in SULA", "fails", _fail_section),
        "ablation": Section("ablation", "Stand-in ablation", "needs x", _needs_x, requires=("x",)),
        "martingale": Section("martingale", "Stand-in martingale", "needs sula", _needs_x, requires=("sula",)),
    }
    monkeypatch.setattr(_sections, "SECTIONS", reg)
    return reg


def test_report_document_files_and_schema(tiny_model, fake_sections, tmp_path):
    doc = bl.report(tiny_model, tmp_path, seed=3, progress=False)
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(doc))
    validate(tmp_path / "report.json")
    assert doc["status"] == "partial"
    secs = doc["sections"]
    assert [secs[n]["status"] for n in ("geometry", "sula", "ablation", "martingale")] == \
        ["ok", "error", "ok", "skipped"]
    assert secs["sula"]["error"]["type"] == "ValueError"
    assert "exploded on purpose" in secs["sula"]["error"]["message"]
    assert "broken" in " ".join(secs["geometry"]["notes"])
    # numbers: the metric equals an independent recomputation from the CSV table
    df = pd.read_csv(tmp_path / secs["geometry"]["tables"][0]["file"])
    m = secs["geometry"]["metrics"][0]
    assert m["value"] == pytest.approx(df["x_bits"].mean(), rel=1e-12)
    assert m["ci"]["low"] < m["value"] < m["ci"]["high"] and m["ci"]["level"] == 0.95
    assert m["units"] == "bits" and m["baseline"] == {"value": 0.0, "label": "zero"}
    assert m["references"] and m["references"][0]["source"].startswith("Paper A")
    assert secs["geometry"]["metrics"][1]["value"] is None  # NaN -> null, JSON stays valid
    assert secs["ablation"]["metrics"][0]["value"] == pytest.approx(df["x_bits"].std(ddof=0))
    assert [r["key"] for r in doc["summary"]] == ["geometry.mixed.pc1", "geometry.key_orthogonality",
                                                    "ablation.corr_clean"]
    # provenance
    assert doc["settings"]["seed"] == 3 and doc["model"]["name"] == "tiny-llama"
    assert doc["model"]["n_parameters"] == sum(p.numel() for p in tiny_model.parameters())
    assert doc["environment"]["torch"] and doc["environment"]["transformer_lens"]
    assert set(doc["timings_s"]) >= {"geometry", "sula", "ablation", "martingale", "total"}
    # file hashes
    for rel, meta in doc["files"].items():
        data = (tmp_path / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"] and len(data) == meta["bytes"]


def test_html_is_self_contained(tiny_model, fake_sections, tmp_path):
    bl.report(tiny_model, tmp_path, progress=False)
    html = (tmp_path / "report.html").read_text()
    from plotly.offline import get_plotlyjs

    assert get_plotlyjs()[:2000] in html  # plotly.js inline
    # nothing is loaded from elsewhere: no src/href pointing at a URL, no <link> stylesheets
    assert not re.search(r"""<(script|img|link|iframe)[^>]+(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert "<link" not in html.lower()
    assert html.count("class='bl-figure'") == 1
    assert "analysis exploded on purpose" in html
    import html as htmllib

    from bayes_lens.reporting._references import CAVEATS

    for caveat in CAVEATS:  # the stand-in registry names all four sections: every caveat is listed
        assert htmllib.escape(caveat, quote=True) in html


def test_caveats_follow_the_sections_run(tiny_model, fake_sections, tmp_path):
    """A geometry-only report lists the general and the geometry caveats, none about SULA, ablation, martingales."""
    import html as htmllib

    from bayes_lens.reporting._references import SECTION_CAVEATS

    doc = bl.report(tiny_model, tmp_path, sections=["geometry"], progress=False)
    general = [t for about, t in SECTION_CAVEATS if about is None]
    geometry = [t for about, t in SECTION_CAVEATS if about and "geometry" in about]
    others = [t for about, t in SECTION_CAVEATS if about and "geometry" not in about]
    assert general and geometry and others
    assert doc["caveats"] == [t for about, t in SECTION_CAVEATS if about is None or "geometry" in about]
    html = (tmp_path / "report.html").read_text()
    for text in others:
        assert text not in doc["caveats"]
        assert htmllib.escape(text, quote=True) not in html.split("id='caveats'")[1].split("</section>")[0]


def test_same_seed_same_numbers(tiny_model, fake_sections, tmp_path):
    a = bl.report(tiny_model, tmp_path / "a", seed=1, progress=False)
    b = bl.report(tiny_model, tmp_path / "b", seed=1, progress=False)
    c = bl.report(tiny_model, tmp_path / "c", seed=2, progress=False)
    assert a["summary"] == b["summary"]
    assert a["summary"][0]["value"] != c["summary"][0]["value"]


def test_strict_reraises(tiny_model, fake_sections, tmp_path):
    with pytest.raises(ValueError, match="on purpose"):
        bl.report(tiny_model, tmp_path, strict=True, progress=False)
    assert not (tmp_path / "report.json").exists()


def test_interrupted_report_keeps_previous(tiny_model, fake_sections, tmp_path, monkeypatch):
    bl.report(tiny_model, tmp_path, sections=["geometry"], progress=False)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    def interrupted(ctx):
        raise KeyboardInterrupt

    fake_sections["sula"] = Section("sula", "x", "x", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bl.report(tiny_model, tmp_path, seed=5, progress=False)
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["report.html", "report.json", "tables"]


def test_bad_input_fails_before_running(tiny_model, fake_sections, tmp_path):
    ran = []
    fake_sections["geometry"] = Section("geometry", "x", "x", lambda ctx: ran.append(1) or SectionOutput())
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError, match="not writable"):
        bl.report(tiny_model, tmp_path / "file" / "out")
    with pytest.raises(InvalidInputError, match="unknown report section"):
        bl.report(tiny_model, tmp_path, sections=["geometry", "nope"])
    with pytest.raises(InvalidInputError, match="seed"):
        bl.report(tiny_model, tmp_path, seed=-1)
    with pytest.raises(InvalidInputError, match="TransformerLens model"):
        bl.report(object(), tmp_path)
    with pytest.raises(InvalidInputError, match="unknown size"):
        bl.report(tiny_model, tmp_path, overrides={"no_such_size": 1})
    assert ran == [] and not (tmp_path / "report.json").exists()


def test_public_names_have_one_meaning_however_imported():
    """No public function shares its name with a module: importing the packages first changes nothing."""
    import inspect
    import types

    import bayes_lens._geometry  # noqa: F401
    import bayes_lens.reporting  # noqa: F401

    for name in ("report", "geometry", "value_manifold", "attach", "compare_patched"):
        obj = getattr(bl, name)
        assert inspect.isfunction(obj), name
        assert not isinstance(obj, types.ModuleType)
    assert list(inspect.signature(bl.report).parameters)[:2] == ["model", "out"]
    assert list(inspect.signature(bl.geometry).parameters)[:2] == ["source", "prompts"]


def test_schema_rejects_broken_documents(tiny_model, fake_sections, tmp_path):
    doc = bl.report(tiny_model, tmp_path, sections=["geometry"], progress=False)
    validate(doc)
    broken = json.loads(json.dumps(doc))
    del broken["sections"]["geometry"]["metrics"][0]["units"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    broken = json.loads(json.dumps(doc))
    broken["sections"]["geometry"]["status"] = "error"  # an error status needs an error record
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


@pytest.mark.skipif(__import__("browser").find_chromium() is None,
                    reason="chromium is not installed (apt-get install -y chromium)")
def test_browser_check_sees_rendering_and_its_failures(tiny_model, fake_sections, tmp_path):
    """The offline Chromium check passes a good page and catches a script error or a missing plotly.js."""
    from browser import render

    out = tmp_path / "r"
    bl.report(tiny_model, out, sections=["geometry"], progress=False)
    good = render(out / "report.html")
    assert (good["figures"], good["rendered"], good["errors"], good["console_errors"]) == (1, 1, [], [])
    html = (out / "report.html").read_text()
    broken = tmp_path / "broken.html"
    broken.write_text(html.replace("</body>", "<script>notDefinedAnywhere();</script></body>"))
    res = render(broken)
    assert any("notDefinedAnywhere" in e for e in res["errors"]) and res["console_errors"]
    from plotly.offline import get_plotlyjs

    no_plotly = tmp_path / "no_plotly.html"
    no_plotly.write_text(html.replace(get_plotlyjs(), ""))
    res = render(no_plotly)
    assert res["figures"] == 1 and res["rendered"] == 0 and res["errors"]

