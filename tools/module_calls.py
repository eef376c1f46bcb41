"""Count the module-to-module calls a user's cache makes on its way into ``bl.geometry``.

A design measure, not a benchmark: it runs ``bl.geometry((logits, dict(cache.items())), model=m)`` (and the
``(logits, cache)`` pair) on a tiny random model under ``sys.setprofile`` and counts, among
bayes_lens's own modules, every call whose caller and callee live in different modules
("crossings"), the distinct modules the data passes through, and the calls "back up the layers":
calls from a module into one that imports it (a lower layer calling a higher one), the
back-and-forth a layered design avoids. The statistics (``bayes_lens.metrics``) are counted apart.

The **route** is narrower: the modules whose functions are *handed the user's data* — a call whose
arguments hold the user's cache object, its logits or mask, one of its tensors, or the
``ReducedCache`` made from them. A helper that validates an integer or formats a message is a
crossing but not on the route. It also counts the **hook-name resolutions** (calls of
``adapter.hook_name``) per ``bl.geometry`` call, against the distinct names resolved: "resolved once"
means the two are equal. Run it before and after a redesign:

    python tools/module_calls.py            # summary
    python tools/module_calls.py --edges    # and the module -> module edges with their counts
    python tools/module_calls.py --route    # and the route's modules with what each is handed
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch


def _module_of(frame):
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("bayes_lens") else None


def _import_graph():
    """``{module: modules it imports}`` among bayes_lens's modules, read from the source (imports inside
    functions included), closed transitively: ``B in deps[A]`` means A sits above B in the layering."""
    import ast
    from pathlib import Path

    import bayes_lens

    root = Path(bayes_lens.__file__).resolve().parent
    direct = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        name = ".".join(parts)
        base = parts if is_pkg else parts[:-1]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    target = base[: len(base) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                    mod = ".".join(target)
                else:
                    mod = node.module or ""
                if mod.startswith("bayes_lens"):
                    out.add(mod)
                    out.update(f"{mod}.{a.name}" for a in node.names)  # "from . import adapter"
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("bayes_lens"))
        direct[name] = out
    deps = {}
    for name in direct:
        seen, todo = set(), [name]
        while todo:
            for b in direct.get(todo.pop(), ()):
                if b not in seen and b in direct:
                    seen.add(b)
                    todo.append(b)
        deps[name] = seen
    return deps


_DEPS = None


def _imports(importer: str, imported: str) -> bool:
    """Whether ``importer`` imports ``imported`` (directly or through other bayes_lens modules)."""
    global _DEPS
    if _DEPS is None:
        _DEPS = _import_graph()
    return imported in _DEPS.get(importer, ())


def _holds_data(frame, data_ids, reduced_type) -> bool:
    """Whether the arguments of the call in ``frame`` hold the user's data (by identity) or a reduced cache."""
    code = frame.f_code
    n_args = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    for name in code.co_varnames[:n_args]:
        v = frame.f_locals.get(name)
        vals = v if isinstance(v, (tuple, list)) and len(v) <= 4 else (v,)
        if isinstance(v, dict):  # dict(cache.items()): a new dict of the cache's own tensors
            vals = list(v.values())[:3]
        if any(id(x) in data_ids or isinstance(x, reduced_type) for x in vals):
            return True
    return False


def trace(fn, data_ids=frozenset(), reduced_type=type(None)):
    calls = collections.Counter()
    modules = set()
    route = collections.defaultdict(set)  # module -> functions handed the user's data
    names = collections.Counter()  # hook names resolved by adapter.hook_name
    back = 0
    stack = []  # bayes_lens module of every active bayes_lens frame (None for others)

    def prof(frame, event, arg):
        nonlocal back
        if event == "call":
            callee = _module_of(frame)
            if callee is not None and _holds_data(frame, data_ids, reduced_type):
                route[callee].add(frame.f_code.co_name)
            if callee == "bayes_lens.adapter._hooks" and frame.f_code.co_name == "hook_name":
                names[(frame.f_locals.get("layer"), frame.f_locals.get("site"))] += 1
            caller = next((m for m in reversed(stack) if m is not None), None)
            if callee is not None:
                modules.add(callee)
                if caller is not None and caller != callee:
                    calls[(caller, callee)] += 1
                    # going back up the layers: the callee imports from the caller (a lower layer calls up)
                    if _imports(callee, caller) and not _imports(caller, callee):
                        back += 1
            stack.append(callee)
        elif event == "return":
            if stack:
                stack.pop()

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls, modules, back, route, names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edges", action="store_true", help="print every module -> module edge and its count")
    ap.add_argument("--route", action="store_true", help="print the route's modules and their functions")
    args = ap.parse_args(argv)
    import bayes_lens as bl
    from bayes_lens.models.tiny import tiny_model
    from bayes_lens.reduced import ReducedCache

    model = tiny_model("hooked", n_layers=2)
    prompts = [f"prompt number {i} says" + " x" * (i % 4) for i in range(8)]
    tokens, mask = bl.adapter.tokenize(model, prompts)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
    bl.geometry((logits, cache), attention_mask=mask, n_boot=2, n_null=2)  # warm
    for label, fn in (
        ("(logits, dict(cache.items())) + model=", lambda: bl.geometry((logits, dict(cache.items())), model=model,
                                                                        attention_mask=mask, n_boot=2, n_null=2)),
        ("(logits, cache) pair", lambda: bl.geometry((logits, cache), attention_mask=mask, n_boot=2, n_null=2)),
    ):
        data_ids = {id(x) for x in (logits, cache, mask, *cache.values())}
        calls, modules, back, route, names = trace(fn, data_ids, ReducedCache)
        data = {e: k for e, k in calls.items() if not any(m.startswith("bayes_lens.metrics") for m in e)}
        data_modules = {m for e in data for m in e}
        print(f"{label}: {sum(calls.values())} module-to-module calls over {len(calls)} edges, "
              f"{len(modules)} modules, {back} calls back up the layers; outside bayes_lens.metrics: "
              f"{sum(data.values())} calls over {len(data)} edges, {len(data_modules)} modules")
        on_route = sorted(m for m in route if not m.startswith("bayes_lens.metrics"))
        packages = sorted({m.split(".")[1] if m.count(".") >= 1 else m for m in on_route})
        print(f"  route (modules handed the user's data, outside metrics): {len(on_route)} modules in "
              f"{len(packages)} top-level modules/packages ({', '.join(packages)}); hook names resolved "
              f"{sum(names.values())} times for {len(names)} distinct names")
        if args.route:
            for m in on_route:
                print(f"  {m}: {', '.join(sorted(route[m]))}")
        if args.edges:
            for (a, b), k in sorted(calls.items(), key=lambda kv: -kv[1]):
                print(f"  {k:5d}  {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
