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
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True)
