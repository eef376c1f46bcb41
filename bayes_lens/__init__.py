"""bayes_lens: measure whether a TransformerLens model carries, and uses, Bayesian geometry.

The public surface (see the README, "Quickstart" and "Layout") is listed in ``__all__``. Heavy
submodules are imported lazily on first attribute access, so ``import bayes_lens`` stays fast and a
missing optional extra only matters when it is used. Every public name has one meaning: no function shares its name with a module (the geometry metrics live in
the private package ``bayes_lens._geometry``, the report writer in ``bayes_lens.reporting``).

Example
-------
>>> import bayes_lens as bl
>>> model = bl.load_model()                    # doctest: +SKIP
>>> prompts = bl.prompts.mixed(model, n_prompts=75)    # doctest: +SKIP
>>> bl.geometry(model, prompts).to_dataframe() # doctest: +SKIP

The same calls on a tiny random model (no download, a second):

>>> model = bl.models.tiny.tiny_model("bridge")
>>> geo = bl.geometry(model, ["the cat is a dog", "a bird is the moon", "the tree is a house",
...                           "a stone is the river", "the lamp is a cloud"], n_boot=100, n_null=20, n_perm=100)
>>> geo.value_manifold.n_prompts, geo.value_manifold.hook_name
(5, 'blocks.1.attn.hook_v')
"""

from __future__ import annotations

import importlib as _importlib

from ._namespace import import_submodule, package_dir
from .errors import (
    BayesLensError,
    CheckpointError,
    InvalidInputError,
    LayerIndexError,
    LockTimeoutError,
    MissingExtraError,
    MissingHookError,
    ModelLoadError,
    NonFiniteError,
    NotAllowedError,
    TokenizationError,
    UnsupportedModelError,
    WriteError,
)

__version__ = "0.1.0"

from ._progress import quiet_tqdm_in_kernels  # noqa: E402

quiet_tqdm_in_kernels()   # no "TqdmWarning: IProgress not found" in Jupyter when transformers loads
del quiet_tqdm_in_kernels

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "adapter": ("bayes_lens.adapter", None),
    "load_model": ("bayes_lens.models", "load_model"),
    "load_gguf": ("bayes_lens.models", "load_gguf"),
    "metrics": ("bayes_lens.metrics", None),
    "models": ("bayes_lens.models", None),
    "collect": ("bayes_lens.collect", None),
    "interventions": ("bayes_lens.interventions", None),
    "estimators": ("bayes_lens.estimators", None),
    "hooks": ("bayes_lens.hooks", None),
    "hook_filter": ("bayes_lens.hooks", "hook_filter"),
    "hookpoints": ("bayes_lens.hookpoints", None),
    "attach": ("bayes_lens.hookpoints", "attach"),
    "detach": ("bayes_lens.hookpoints", "detach"),
    "value_manifold": ("bayes_lens._geometry", "value_manifold"),
    "key_orthogonality": ("bayes_lens._geometry", "key_orthogonality"),
    "attention_focusing": ("bayes_lens._geometry", "attention_focusing"),
    "entropy_alignment": ("bayes_lens._geometry", "entropy_alignment"),
    "geometry": ("bayes_lens._geometry", "geometry"),
    "ValueManifold": ("bayes_lens._geometry", "ValueManifold"),
    "KeyOrthogonality": ("bayes_lens._geometry", "KeyOrthogonality"),
    "AttentionFocusing": ("bayes_lens._geometry", "AttentionFocusing"),
    "EntropyAlignment": ("bayes_lens._geometry", "EntropyAlignment"),
    "Geometry": ("bayes_lens._geometry", "Geometry"),
    "ReducedCache": ("bayes_lens.reduced", "ReducedCache"),
    "reduce_cache": ("bayes_lens.collect", "reduce_cache"),
    "Estimate": ("bayes_lens._results", "Estimate"),
    "prompts": ("bayes_lens.prompts", None),
    "compare_domains": ("bayes_lens.domains", "compare_domains"),
    "sula": ("bayes_lens.sula", None),
    "EntropyAxis": ("bayes_lens.ablation", "EntropyAxis"),
    "patched": ("bayes_lens.ablation", "patched"),
    "compare_patched": ("bayes_lens.ablation", "compare_patched"),
    "localize": ("bayes_lens.ablation", "localize"),
    "confidence": ("bayes_lens._confidence", "confidence"),
    "Confidence": ("bayes_lens._confidence", "Confidence"),
    "screen_neurons": ("bayes_lens._confidence", "screen_neurons"),
    "steering": ("bayes_lens.steering", None),   # a callable module: bl.steering(model, items, ...)
    "martingale": ("bayes_lens.martingale", None),
    "cot_length": ("bayes_lens.cot", "cot_length"),
    "reproduce": ("bayes_lens.reproduction", "reproduce"),
    "windtunnel": ("bayes_lens.windtunnel", None),
    "shard": ("bayes_lens.shard", None),
    "reporting": ("bayes_lens.reporting", None),
    "report": ("bayes_lens.reporting", "report"),
    "NotFittedError": ("bayes_lens.errors", "NotFittedError"),   # lazy: its scikit-learn base is slow to import
}

__all__ = [
    "__version__",
    "BayesLensError",
    "CheckpointError",
    "InvalidInputError",
    "LayerIndexError",
    "LockTimeoutError",
    "MissingExtraError",
    "MissingHookError",
    "ModelLoadError",
    "NonFiniteError",
    "NotAllowedError",
    "TokenizationError",
    "UnsupportedModelError",
    "WriteError",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = _importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    return import_submodule(globals(), name)  # bl.cot, bl.domains ...: public modules not in __all__


__dir__ = package_dir(globals())
