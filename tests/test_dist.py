"""The installable artefact (issue 26.1): the wheel built from this tree holds every module and data
file, installs into a fresh virtual environment, and runs from there.

The wheel is built the way ``make dist`` builds it (``python -m build``: sdist, then the wheel from
the sdist, so a data file missing from the sdist is missing from the wheel too), offline
(``--no-isolation``: this environment's setuptools); without the ``build`` package (it comes with
the ``dev`` extra) ``pip wheel`` builds it from the tree. It is then installed with ``--no-deps``
into a fresh venv whose only other packages come from *this* environment's site-packages through a
``.pth`` line (torch and TransformerLens are ~700 MB; re-downloading them would test the registry,
not the wheel). ``.pth`` files inside that folder are not processed, so this environment's editable
install of bayes_lens is not visible: the commands must import the installed copy, which is checked
(``bayes_lens.__file__``), with the source tree neither on ``PYTHONPATH`` nor the working directory.
What this does not test is pip resolving the wheel's dependencies from the registry (the README's
install section does that; it was run by hand in a fresh venv for issue 26); the wheel's
``Requires-Dist`` is checked against pyproject.toml here.

Marked ``dist`` (about a minute): ``pytest -m "not dist"`` skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "bayes_lens"


def _source_files():
    return sorted(str(p.relative_to(ROOT)) for p in PKG.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel path, sdist path or None), built from a copy of the tree (the worktree stays clean)."""
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools is not installed here; pip install 'setuptools>=77' (or the dev extra)")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} is older than pyproject.toml's build requirement (>=77)")
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "CHANGELOG.md"):
        shutil.copy2(ROOT / name, src / name)
    (src / "docs").mkdir()
    for page in (ROOT / "docs").glob("*.md"):   # the pages README.md links; MANIFEST.in puts them in the sdist
        shutil.copy2(page, src / "docs" / page.name)
    shutil.copytree(PKG, src / "bayes_lens", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp / "out"
    import importlib.util

    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
               "-w", str(out), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = sorted(out.glob("bayes_lens-*.whl"))
    sdists = sorted(out.glob("bayes_lens-*.tar.gz"))
    assert len(wheels) == 1, list(out.iterdir())
    return wheels[0], (sdists[0] if sdists else None)


def test_wheel_holds_every_module_and_data_file_and_the_entry_point(built):
    import tomllib

    wheel, sdist = built
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    missing = [f for f in _source_files() if f not in names]
    assert not missing, f"not in the wheel: {missing}"
    for data in ("bayes_lens/data/prompts/mixed.jsonl", "bayes_lens/data/windtunnel/bijection/model.safetensors",
                 "bayes_lens/data/windtunnel/hmm/config.json", "bayes_lens/reporting/report.schema.json"):
        assert data in names
    assert "bayes-lens = bayes_lens.cli:main" in entry
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    from packaging.requirements import Requirement

    requires = [Requirement(ln.split(":", 1)[1].strip()) for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    plain = {(r.name, r.specifier) for r in requires if r.marker is None}
    assert plain == {(Requirement(d).name, Requirement(d).specifier) for d in project["dependencies"]}
    assert f"Version: {project['version']}" in meta
    if sdist is not None:
        import tarfile

        with tarfile.open(sdist) as t:
            in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        assert not [f for f in _source_files() if f not in in_sdist]
        assert "README.md" in in_sdist and "pyproject.toml" in in_sdist
        linked = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"CHANGELOG.md"}
        assert not linked - in_sdist, f"pages README.md links, missing from the sdist: {sorted(linked - in_sdist)}"


def _clean_env():
    """No PYTHONPATH (the test run puts the source tree there), offline, no progress bars."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(BAYES_LENS_PROGRESS="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory):
    """A fresh venv with the wheel installed (--no-deps) and this environment's packages via a .pth line."""
    wheel, _ = built
    root = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    py = root / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # install first: with the .pth line in place pip would see this environment's bayes-lens and skip it
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                        str(wheel)], capture_output=True, text=True, timeout=600, env=_clean_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (root / "bin" / "bayes-lens").is_file() and (site / "bayes_lens" / "__init__.py").is_file()
    parent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_bayes_lens_test_parent.pth").write_text("\n".join(sorted(parent)) + "\n")
    return root, site


def _run(venv, *args, timeout=600):
    root, _ = venv
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=_clean_env(), cwd=root)
    assert r.returncode == 0, f"{args}: rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


_ANALYSIS = """
import json, bayes_lens as bl
from bayes_lens.models.tiny import tiny_model
from bayes_lens.adapter import has_hooked_transformer
m = tiny_model("hooked" if has_hooked_transformer() else "bridge", gqa=True, rotary=True)
prompts = [f"The number {i} is followed by" for i in range(24)]
vm = bl.value_manifold(m, prompts, layer=1, n_boot=50, n_null=20, seed=0)
print(json.dumps({"file": bl.__file__, "pc1": vm.pc1.value, "pc12": vm.pc12.value, "pc1_ci": list(vm.pc1.ci),
                  "n_mixed": len(bl.prompts.pool("mixed")), "repr": repr(vm)}))
"""


def test_installed_wheel_runs_the_cli_and_an_analysis_from_its_own_copy(venv):
    root, site = venv
    out = _run(venv, str(root / "bin" / "bayes-lens"), "--version")
    first, *rest = out.strip().splitlines()
    assert first == "bayes-lens " + __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())[
        "project"]["version"]
    assert rest and rest[0].startswith("TransformerLens ") and "major" in rest[0]   # which TL the wheel found
    out = _run(venv, str(root / "bin" / "bayes-lens"), "models")
    assert "default" in out and "gemma-3-270m" in out
    # the shipped wind-tunnel checkpoint is package data: read from the installed copy
    res = json.loads(_run(venv, str(root / "bin" / "bayes-lens"), "windtunnel", "eval", "--checkpoint", "bijection",
                          "--n", "50", "--json"))
    import bayes_lens as bl

    model, task = bl.windtunnel.load("bijection")
    here = bl.windtunnel.evaluate(model, task, n_seqs=50, seed=0)
    assert res["n"] == 50 and res["mae_bits"]["value"] == pytest.approx(here.mae_bits.value, rel=1e-9, abs=1e-12)

    got = json.loads(_run(venv, str(root / "bin" / "python"), "-c", _ANALYSIS).strip().splitlines()[-1])
    assert Path(got["file"]).resolve().is_relative_to(site.resolve()), got["file"]  # the installed copy
    assert not Path(got["file"]).resolve().is_relative_to(ROOT)
    # the same analysis from the source tree gives the same numbers
    from bayes_lens.adapter import has_hooked_transformer
    from bayes_lens.models.tiny import tiny_model

    m = tiny_model("hooked" if has_hooked_transformer() else "bridge", gqa=True, rotary=True)
    vm = bl.value_manifold(m, [f"The number {i} is followed by" for i in range(24)], layer=1, n_boot=50,
                           n_null=20, seed=0)
    assert got["pc1"] == pytest.approx(vm.pc1.value, rel=1e-6) and got["pc12"] == pytest.approx(vm.pc12.value, rel=1e-6)
    assert got["pc1_ci"] == pytest.approx(list(vm.pc1.ci), rel=1e-6)
    assert got["n_mixed"] == sum(1 for ln in (PKG / "data/prompts/mixed.jsonl").read_text().splitlines() if ln.strip())
    assert "n = 24 prompts" in got["repr"]
