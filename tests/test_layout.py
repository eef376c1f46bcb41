"""The package's shape: no private names imported across modules, no import cycles, one meaning per name."""

import ast
import importlib
import re
from pathlib import Path

import pytest

import bayes_lens as bl

PKG = Path(bl.__file__).resolve().parent
PRIVATE_IMPORT = re.compile(r"^\s*from \.[A-Za-z_.]* import .*\b_[a-z]")


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def test_no_private_names_imported_across_modules():
    hits = [f"{path.relative_to(PKG.parent)}:{i}: {line.strip()}"
            for _, path in _modules()
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if PRIVATE_IMPORT.match(line)]
    assert not hits, "make these names public or move them:\n" + "\n".join(hits)


def _module_level_imports(name: str, path: Path) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):  # lazy imports inside functions count too: a cycle is a cycle
        if isinstance(node, ast.ImportFrom) and node.level:
            target = base[: len(base) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            out.add(".".join(target))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bayes_lens"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("bayes_lens"))
    return out


def test_no_import_cycles_between_modules():
    mods = dict(_modules())
    graph = {m: {t for t in _module_level_imports(m, p) if t in mods and t != m} for m, p in mods.items()}
    # a package's __init__ importing its own submodules is the re-export pattern, not a cycle
    for m in graph:
        graph[m] = {t for t in graph[m] if not (t.startswith(m + ".") and mods[m].name == "__init__.py")}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_every_public_name_has_one_meaning():
    import importlib
    import types

    for name in bl.__all__:
        obj = getattr(bl, name)
        if isinstance(obj, types.ModuleType):
            continue
        try:
            mod = importlib.import_module(f"bayes_lens.{name}")
        except ImportError:
            continue
        raise AssertionError(f"bl.{name} is a {type(obj).__name__} but bayes_lens.{name} is also a module ({mod})")


def test_results_holding_arrays_compare_without_raising():
    """``a == b`` on two results (with tensors, arrays, DataFrames inside) never raises."""
    import dataclasses

    import numpy as np
    import torch

    from bayes_lens._results import Result

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for mod in ("_geometry", "sula", "ablation", "martingale", "windtunnel", "domains", "prompts", "cot"):
        __import__(f"bayes_lens.{mod}")
    checked = 0
    for cls in set(subclasses(Result)):
        if not dataclasses.is_dataclass(cls):
            continue
        a, b = object.__new__(cls), object.__new__(cls)
        for obj in (a, b):  # distinct array objects in each, so no identity short-cut hides a comparison
            for f in dataclasses.fields(cls):
                object.__setattr__(obj, f.name, torch.zeros(2) if "Tensor" in str(f.type) else np.zeros(2))
        assert (a == b) in (True, False), cls  # identity comparison when eq=False: never an array truth error
        checked += 1
    assert checked >= 15


PUBLIC_PACKAGES = ["bayes_lens", "bayes_lens.metrics", "bayes_lens.martingale", "bayes_lens.sula",
                   "bayes_lens.ablation", "bayes_lens.shard", "bayes_lens.windtunnel", "bayes_lens.reporting",
                   "bayes_lens.models"]


def _public_submodules(package_dir: Path) -> set:
    return {p.stem if p.is_file() else p.name for p in package_dir.iterdir()
            if not p.name.startswith("_")
            and ((p.is_file() and p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").is_file()))}


@pytest.mark.parametrize("name", PUBLIC_PACKAGES)
def test_dir_shows_only_the_public_names(name):
    """``dir(pkg)`` is ``__all__`` plus the public submodules, sorted; every one of them resolves."""
    pkg = importlib.import_module(name)
    assert len(set(pkg.__all__)) == len(pkg.__all__), "a name listed twice in __all__"
    expected = sorted(set(pkg.__all__) | _public_submodules(Path(pkg.__file__).parent))
    assert dir(pkg) == expected
    for attr in [*pkg.__all__, *expected]:
        getattr(pkg, attr)  # AttributeError/ImportError here is a broken export
    with pytest.raises(AttributeError):
        getattr(pkg, "no_such_name")


def test_windtunnel_does_not_export_its_command_line_wiring():
    """The ``bayes-lens windtunnel`` argparse set-up and commands stay out of ``bl.windtunnel.__all__``."""
    from bayes_lens import _windtunnel_args
    from bayes_lens.windtunnel import cli

    wiring = {n for n in vars(cli) if callable(getattr(cli, n)) and getattr(getattr(cli, n), "__module__", "")
              == cli.__name__} | set(_windtunnel_args.__all__)
    assert "run_command" in wiring
    assert not wiring & set(bl.windtunnel.__all__)
    for n in bl.windtunnel.__all__:
        assert getattr(getattr(bl.windtunnel, n), "__module__", "") not in (cli.__name__, _windtunnel_args.__name__), n


UNOPENABLE = re.compile(r"\bissues?[ -]\d+|DESIGN\.md", re.IGNORECASE)


def test_no_citations_a_reader_cannot_open():
    """Source, benchmarks and tools say the reason itself, not "issue 13" or a design file the repo lacks.

    (An upstream project's numbered issue, written ``TransformerLens GitHub issue #907``, can be opened.)
    """
    root = PKG.parent
    files = [p for d in ("bayes_lens", "benchmarks", "tools") for p in sorted((root / d).rglob("*"))
             if p.suffix in (".py", ".md", ".txt", ".toml", ".json") and "__pycache__" not in p.parts]
    assert any(p.name == "RESULTS.md" for p in files)
    hits = [f"{p.relative_to(root).as_posix()}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if UNOPENABLE.search(line)]
    assert not hits, "\n".join(hits)


def _imports_with_lines(name: str, path: Path, known: set):
    """(line, imported module) for every import of a bayes_lens module in ``path``, lazy ones included;
    ``from pkg import mod`` counts as importing ``pkg.mod`` when that is a module."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - (node.level - 1)] + (node.module.split(".") if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "bayes_lens":
                continue
            yield node.lineno, target
            yield from ((node.lineno, f"{target}.{a.name}") for a in node.names if f"{target}.{a.name}" in known)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "bayes_lens")


def _private_owner(module: str):
    """The package a private module belongs to: the parent of its last ``_``-named part (None if public)."""
    parts = module.split(".")
    private = [i for i, p in enumerate(parts) if p.startswith("_")]
    return ".".join(parts[: private[-1]]) if private else None


def test_private_modules_are_imported_only_inside_their_package():
    """``a.b._c`` (and a private subpackage ``a._p``) is imported only by modules of package ``a.b`` (``a``).

    Root-level private modules (``bayes_lens._validate``, ``bayes_lens._results``) serve the whole
    package; ``bayes_lens.shard._sharded`` is shard's own, ``bayes_lens._geometry._sources`` the
    geometry package's.
    """
    mods = dict(_modules())
    assert _private_owner("bayes_lens._geometry._sources") == "bayes_lens._geometry"
    assert _private_owner("bayes_lens._validate") == "bayes_lens" and _private_owner("bayes_lens.hooks") is None
    hits = []
    for name, path in mods.items():
        for line, target in _imports_with_lines(name, path, set(mods)):
            owner = _private_owner(target)
            if owner is not None and name != owner and not name.startswith(owner + "."):
                hits.append((target, f"{path.relative_to(PKG.parent).as_posix()}:{line}: {name} imports {target}"))
    assert not hits, "make the name public in its package's __init__, or move the shared helper to a root-level " \
        "private module:\n" + "\n".join(h for _, h in hits)


TESTS = Path(__file__).resolve().parent


def _test_functions(path: Path) -> list:
    """The names pytest would collect from ``path``: ``test_*`` functions at module level and in ``Test*`` classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name.startswith("test")]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        names += [f"{cls.name}.{n.name}" for n in cls.body
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")]
    return names


def test_no_test_file_is_empty():
    """Every ``tests/**/test_*.py`` defines at least one test: a merge once left four of them at 0 bytes
    (38 martingale tests among them) and the suite stayed green for twenty commits."""
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 30
    empty = [p.relative_to(TESTS).as_posix() for p in files if not _test_functions(p)]
    assert not empty, "these test files define no test (emptied by a merge?): " + ", ".join(empty)


def _public_subpackages() -> list:
    return sorted(p.name for p in PKG.iterdir()
                  if p.is_dir() and not p.name.startswith("_") and (p / "__init__.py").is_file())


def test_every_public_subpackage_has_test_modules_of_its_own():
    """Tests mirror the package: ``bayes_lens/<pkg>/`` is tested by ``tests/test_<pkg>.py`` or
    ``tests/<pkg>/test_*.py``, which define tests and import the package itself."""
    subs = _public_subpackages()
    assert {"ablation", "martingale", "shard", "windtunnel"} <= set(subs)
    missing = []
    for name in subs:
        own = [TESTS / f"test_{name}.py", *sorted((TESTS / name).glob("test_*.py"))]
        own = [p for p in own if p.is_file() and _test_functions(p)]
        uses = re.compile(rf"(bayes_lens|\bbl)\.{name}\b|from bayes_lens import [^\n]*\b{name}\b")
        if not any(uses.search(p.read_text(encoding="utf-8")) for p in own):
            missing.append(f"bayes_lens.{name}: expected tests/test_{name}.py or tests/{name}/test_*.py "
                           f"with tests that use bayes_lens.{name}")
    assert not missing, "\n".join(missing)


# --- Choice and count checks live in bayes_lens/_validate.py (issue 33 §5) ---------------------------
# A hand-written "must be one of" / "must be a positive integer" raise drifts from the shared rule (three
# n_boot rules, seven copies of the positions check); call check_choice / check_count / check_int etc.
_HAND_CHECK = re.compile(r"must be (one of\b|'[^']*'(,| or)|a positive integer|a non-negative integer|an integer\b"
                         r"|an integer >=|>= ?\d|≥ ?\d|at least \d)")
#: (file, message fragment) -> why the site stays hand-written.
_HAND_CHECK_ALLOWED = {
    ("bayes_lens/cot.py", "log_base must be 'e' or a positive number"):
        "a string OR a number: neither check_choice nor check_float alone describes the accepted set",
    ("bayes_lens/cot.py", "log_base not in ("):
        "the string half of the same log_base check",
    ("bayes_lens/martingale/_falck.py", "lags must be >= 2"):
        "a rule over each element of a list, not one scalar count",
    ("bayes_lens/ablation/_axis.py", "isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0"):
        "each element of a layer list (LayerIndexError names the model= fix), not one scalar count",
    ("bayes_lens/shard/_engines.py", "engine must be 'local', 'torchrun' or an engine object"):
        "an engine name OR an engine object (duck-typed); the message names both",
    ("bayes_lens/shard/_spec.py", "ModelSpec.loader must be 'default', a model path or"):
        "a free-form string (a path or module:function), not a closed set of choices",
    ("bayes_lens/shard/_run.py", "must be 'all', an int or a list of ints"):
        "'all', one layer or a list of layers: a layer spec, not a choice",
    ("bayes_lens/martingale/_permutation.py", "must be at least 2·max(ks)"):
        "a bound that depends on another argument (ks)",
    ("bayes_lens/reporting/_atomic.py", "layout not in ("):
        "reporting is being rewritten by its owner (issue 33); convert to check_choice there",
    ("bayes_lens/reporting/_atomic.py", "layout must be 'auto', 'links' or 'copy'"):
        "reporting is being rewritten by its owner (issue 33); convert to check_choice there",
    ("bayes_lens/metrics/keys.py", "d must be at least 2"):
        "a dimension of a closed-form formula, checked where it is computed",
    ("bayes_lens/metrics/keys.py", "d_model and d_head must be at least 2"):
        "dimensions of a closed-form simulation, checked where they are used",
}
#: Messages that start with "every ..." state a rule over each element of an array (every n, every k),
#: which no scalar validator covers.
_ELEMENTWISE = re.compile(r"^every ")
#: Whole files left out, with the reason.
_HAND_CHECK_SKIP: dict = {}


def _message_text(node) -> str:
    """The literal text of a raise's first argument (an f-string's {fields} as '{}'), else ''."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message_text(node.left) + _message_text(node.right)
    return ""


def _allowed(rel: str, text: str) -> bool:
    return any(f == rel and frag in text for f, frag in _HAND_CHECK_ALLOWED)


def _hand_written_checks():
    for _, path in _modules():
        rel = path.relative_to(PKG.parent).as_posix()
        if rel == "bayes_lens/_validate.py" or rel.startswith(tuple(_HAND_CHECK_SKIP)):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            # 1. a raise whose message spells out a choice or count rule
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                text = _message_text(node.exc.args[0])
                if _HAND_CHECK.search(text) and not _ELEMENTWISE.match(text) and not _allowed(rel, text):
                    yield f"{rel}:{node.lineno}: {text[:90]!r}"
            # 2. the hand-written integer test: isinstance(x, bool) or not isinstance(x, int/Integral)
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
                src = ast.unparse(node)
                if re.search(r"isinstance\((\w+(\.\w+)*), bool\)", src) and \
                        re.search(r"not isinstance\(\w+(\.\w+)*, \(?(int|numbers\.Integral|np\.integer)", src) \
                        and not _allowed(rel, src):
                    yield f"{rel}:{node.lineno}: {src[:90]}"
            # 3. `if x not in ("a", "b"): raise`: a closed set of string choices
            if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                    isinstance(node.test.ops[0], ast.NotIn) and isinstance(node.test.comparators[0], ast.Tuple) and \
                    all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.test.comparators[0].elts) \
                    and node.body and isinstance(node.body[0], ast.Raise) and not _allowed(rel, ast.unparse(node.test)):
                yield f"{rel}:{node.lineno}: {ast.unparse(node.test)[:90]}"


def test_choice_and_count_checks_go_through_validate():
    hits = sorted(set(_hand_written_checks()))
    assert not hits, ("check choices and counts with bayes_lens._validate (check_choice, check_count, check_int, "
                      "check_positions, ...), or allow-list the site with a reason:\n" + "\n".join(hits))


def test_hand_check_allow_list_has_no_stale_entries():
    for (rel, frag), why in _HAND_CHECK_ALLOWED.items():
        assert why and frag in (PKG.parent / rel).read_text(encoding="utf-8"), (rel, frag)


# --- Where TransformerLens and torch internals live (issue 33 §3) -------------------------------------
#: attributes that are TransformerLens's or torch's internals (not their public API)
_INTERNAL_ATTRS = {"hook_dict", "mod_dict", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_version",
                   "_modules", "_parameters", "_buffers"}
#: the modules allowed to import transformer_lens or touch those attributes -> the name README's Layout gives them
_INTERNALS_ALLOWED = {
    "bayes_lens.adapter": "adapter",         # the face of every model fact, hook name, token and device
    "bayes_lens.hookpoints": "hookpoints",   # bl.attach: registers HookPoints into the model's module tree
    "bayes_lens.models": "models",           # builds and loads TransformerLens models (tiny, GGUF, offline)
    "bayes_lens.ablation._jacobian": "ablation/_jacobian",  # wraps TransformerLens 4's JacobianLens
}


def _touches_internals(path: Path) -> list:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "transformer_lens" for a in node.names):
            out.append(f"{node.lineno}: import transformer_lens")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "transformer_lens":
            out.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and node.attr in _INTERNAL_ATTRS:
            out.append(f"{node.lineno}: .{node.attr}")
    return out


def _internals_owner(name: str):
    return next((m for m in _INTERNALS_ALLOWED if name == m or name.startswith(m + ".")), None)


def test_transformer_lens_internals_live_only_in_the_named_modules():
    hits = [f"{path.relative_to(PKG.parent).as_posix()}:{where}" for name, path in _modules()
            if _internals_owner(name) is None for where in _touches_internals(path)]
    assert not hits, ("TransformerLens or torch internals outside the modules named in README's Layout; ask "
                      "bayes_lens.adapter (add a function there) instead:\n" + "\n".join(hits))
    touching = {_internals_owner(name) for name, path in _modules() if _touches_internals(path)}
    assert touching == set(_INTERNALS_ALLOWED), f"stale allow-list entries: {set(_INTERNALS_ALLOWED) - touching}"


def test_readme_layout_names_every_module_that_touches_internals():
    text = (PKG.parent / "README.md").read_text(encoding="utf-8")
    layout = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    missing = [short for short in _INTERNALS_ALLOWED.values() if f"`{short}`" not in layout]
    assert not missing, f"README's Layout does not name {missing} as touching TransformerLens internals"
