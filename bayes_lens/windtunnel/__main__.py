"""``python -m bayes_lens.windtunnel train|eval ...`` (the same as ``bayes-lens windtunnel ...``)."""

import sys

from ..cli import windtunnel_main

sys.exit(windtunnel_main())
