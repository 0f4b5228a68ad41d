"""``python -m lra.campaign``: the command line of :func:`lra.campaign.cli.main`."""

import sys

from .cli import main

sys.exit(main())
