"""Progress bars for long runs (tqdm, auto-detecting notebooks), switchable off globally.

Set ``BAYES_LENS_PROGRESS=0`` in the environment, or pass ``progress=False`` to any analysis,
to silence them (the test-suite does).
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

__all__ = ["progress", "note", "quiet_tqdm_in_kernels"]


def progress(iterable: Iterable, *, desc: str, total: Optional[int] = None,
             enabled: Optional[bool] = None, unit: str = "it"):
    """Wrap ``iterable`` in a tqdm bar unless disabled (argument or BAYES_LENS_PROGRESS=0).

    ``BAYES_LENS_PROGRESS=0`` wins over ``enabled=True``: a default of ``progress=True`` in a
    function's signature must not turn bars on in a run that switched them off globally.
    """
    env_off = os.environ.get("BAYES_LENS_PROGRESS", "1") in ("0", "false", "False", "")
    if env_off or enabled is False:
        return iterable
    return _bar_class()(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True)


def note(message: str, *, enabled: Optional[bool] = None) -> None:
    """Print one line about a long run to stderr, under the same switches as the bars."""
    import sys

    if os.environ.get("BAYES_LENS_PROGRESS", "1") in ("0", "false", "False", "") or enabled is False:
        return
    print(message, file=sys.stderr, flush=True)


def _bar_class():
    """tqdm's notebook widget where it can render (a Jupyter kernel with ipywidgets), else the plain text bar.

    ``tqdm.auto`` picks the widget in any kernel and, without ipywidgets, warns "IProgress not found"
    and falls back to text anyway: the check here avoids the warning.
    """
    if _in_notebook() and _has_widgets():
        from tqdm.notebook import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


def _in_notebook() -> bool:
    import sys

    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _has_widgets() -> bool:
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None


def quiet_tqdm_in_kernels() -> None:
    """Silence tqdm's "IProgress not found" for the libraries bayes_lens loads, in a Jupyter kernel.

    transformers (``transformers.utils.logging``) and TransformerLens import ``tqdm.auto`` when they
    load; in a kernel without ipywidgets that import prints "TqdmWarning: IProgress not found. Please
    update jupyter and ipywidgets", though none of them draws a bar there. Importing ``tqdm.auto`` once
    here with that one warning filtered leaves tqdm exactly as it would be (the text bar; the widget
    where ipywidgets exists) and the later imports silent. Called when ``bayes_lens`` is imported; does
    nothing outside a kernel or when ``tqdm.auto`` was already imported.
    """
    import sys
    import warnings

    if "ipykernel.zmqshell" not in sys.modules or "tqdm.autonotebook" in sys.modules:
        return
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="IProgress not found")
            import tqdm.auto  # noqa: F401
    except ImportError:  # pragma: no cover - tqdm is a dependency
        pass
