"""Progress bars for long runs (tqdm, auto-detecting notebooks), switchable off globally.

Set ``BAYES_LENS_PROGRESS=0`` in the environment, or pass ``progress=False`` to any analysis,
to silence them (the test-suite does).
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

__all__ = ["progress"]


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
