"""``python -m bayes_lens.windtunnel train|eval ...`` (the same as ``bayes-lens windtunnel ...``)."""

import sys

from .cli import cli_main

sys.exit(cli_main())
