"""Count the module-to-module calls a user's cache makes on its way into ``bl.geometry``.

A design measure, not a benchmark: it runs ``bl.geometry((logits, dict(cache.items())), model=m)`` (and the
``(logits, cache)`` pair) on a tiny random model under ``sys.setprofile`` and counts, among
bayes_lens's own modules, every call whose caller and callee live in different modules
("crossings"), the distinct modules the data passes through, and the calls "back up the layers":
calls from a module into one that imports it (a lower layer calling a higher one), the
back-and-forth a layered design avoids. The statistics (``bayes_lens.metrics``) are counted apart. Run it before and after a redesign:

    python tools/module_calls.py            # summary
    python tools/module_calls.py --edges    # and the module -> module edges with their counts
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch


def _module_of(frame):
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("bayes_lens") else None


def _imports(importer: str, imported: str) -> bool:
    """Whether module ``importer`` holds a name defined in (or the module object of) ``imported``."""
    mod = sys.modules.get(importer)
    if mod is None:
        return False
    for value in vars(mod).values():
        if getattr(value, "__name__", None) == imported and type(value).__name__ == "module":
            return True
        if getattr(value, "__module__", None) == imported:
            return True
    return False


def trace(fn):
    calls = collections.Counter()
    modules = set()
    back = 0
    stack = []  # bayes_lens module of every active bayes_lens frame (None for others)

    def prof(frame, event, arg):
        nonlocal back
        if event == "call":
            callee = _module_of(frame)
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
    return calls, modules, back


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edges", action="store_true", help="print every module -> module edge and its count")
    args = ap.parse_args(argv)
    import bayes_lens as bl
    from bayes_lens.models.tiny import tiny_model

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
        calls, modules, back = trace(fn)
        data = {e: k for e, k in calls.items() if not any(m.startswith("bayes_lens.metrics") for m in e)}
        data_modules = {m for e in data for m in e}
        print(f"{label}: {sum(calls.values())} module-to-module calls over {len(calls)} edges, "
              f"{len(modules)} modules, {back} calls back up the layers; outside bayes_lens.metrics: "
              f"{sum(data.values())} calls over {len(data)} edges, {len(data_modules)} modules")
        if args.edges:
            for (a, b), k in sorted(calls.items(), key=lambda kv: -kv[1]):
                print(f"  {k:5d}  {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
