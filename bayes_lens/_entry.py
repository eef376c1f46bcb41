"""How every bayes_lens command ends: a one-line message and an exit code, never a traceback.

The ``bayes-lens`` CLI (:func:`bayes_lens.cli.main`) and ``python -m bayes_lens.windtunnel`` run their command
through :func:`guarded`: a :class:`~bayes_lens.BayesLensError`
or an ``OSError`` prints ``bayes-lens: error: ...`` and returns 2, an interrupt returns 130, anything else
a one-line "internal error" and 1 (``BAYES_LENS_DEBUG=1`` re-raises it). Importing this module imports no
torch and no analysis, so the wind tunnel's entry point does not sit above the whole CLI.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from .errors import BayesLensError

__all__ = ["guarded"]


def guarded(run: Callable[[], object]) -> int:
    """``run()``'s exit code (None: 0), with every error turned into a one-line message and a code."""
    try:
        return int(run() or 0)
    except BayesLensError as err:
        print(f"bayes-lens: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bayes-lens: interrupted; any existing report was left untouched", file=sys.stderr)
        return 130
    except OSError as err:
        print(f"bayes-lens: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - a one-line message, never a traceback
        if os.environ.get("BAYES_LENS_DEBUG"):
            raise
        print(f"bayes-lens: internal error: {type(err).__name__}: {err} "
              "(set BAYES_LENS_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
